from django.urls import path

from notify import views

app_name = "notify"
urlpatterns = [
    path("", views.subscriptions, name="subscriptions"),
    path("confirm/<str:token>/", views.confirm, name="verify"),
]
