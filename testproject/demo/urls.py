from django.urls import path

from . import views

urlpatterns = [
    path("", views.index),
    path("report/<int:pk>/", views.report),
    path("async-report/<int:pk>/", views.async_report),
    path("sync/<int:account_id>/", views.start_sync),
]
