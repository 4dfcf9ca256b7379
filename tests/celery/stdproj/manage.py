#!/usr/bin/env python
"""The standard-layout project's manage.py (tests/celery/test_check_layout.py runs it)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stdsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
