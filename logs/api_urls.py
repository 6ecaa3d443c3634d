from django.urls import path

from logs import api

urlpatterns = [
    path("training-jobs/<int:pk>/logs/download/", api.LogDownloadView.as_view(), name="training-job-log-download"),
]
