"""The URLconf never imports stdshop.tasks: only autodiscovery reaches the tasks."""

from django.contrib import admin
from django.urls import path
from stdshop.views import ping

urlpatterns = [path("admin/", admin.site.urls), path("ping/", ping)]
