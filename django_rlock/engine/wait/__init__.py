"""The waiting side of the engine: how a thread or task waits for a lock and is handed it.

Layered bottom-up, no module importing one above it:

- ``settings``: every tunable (the old paths ``pubsub.X``, ``waiting.X``, ``wakeline.X`` read
  and write these, ``compat``);
- ``waiter``: one waiting thread or task, its ``State`` and the one method that moves it, and
  ``HandOff`` (what a release needs to hand the lock to it);
- ``channel``: the waiters of one lock channel (queue, active, pending, echoes, wake policies)
  and ``Channels``, a server's channels and the lock every change is made under;
- ``handoff``: reservations by our releasing threads and grants by any process's release;
- ``slot``: a waiter's place in its queue for one wait (what the wait loop calls);
- ``subscription``: the process's connection to a server and its listener thread;
- ``manager``: the above put together per server (``manager(client)``), as the kinds see it;
- ``loop``: the one wait loop (``wait`` / ``await_``) and ``Wait``;
- ``lines``: a waiting thread's own wake line.
"""
