from __future__ import annotations

from django.urls import path
from django.views.generic import RedirectView

from console.pages import jobs as views

app_name = "jobs"
urlpatterns = [
    path("", views.job_list, name="list"),
    # The list lives at the root; its name in the address, typed or kept in a bookmark, finds it too.
    path("training-jobs/", RedirectView.as_view(pattern_name="jobs:list", query_string=True), name="list-by-name"),
    path("training-jobs/new/", views.job_create, name="create"),
    path("training-jobs/bulk/", views.bulk_action, name="bulk"),
    path("training-jobs/live/", views.job_live, name="live"),
    path("training-jobs/<int:pk>/", views.job_detail, name="detail"),
    path("training-jobs/<int:pk>/clone/", views.job_clone, name="clone"),
    path("training-jobs/<int:pk>/stop/", views.job_stop, name="stop"),
    path("training-jobs/<int:pk>/delete/", views.job_delete, name="delete"),
    path("training-jobs/<int:pk>/resume/", views.job_resume, name="resume"),
]
