from __future__ import annotations

from django.contrib import admin
from django.utils.safestring import SafeString

from jobs.admin import console_link
from notify.models import Delivery, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ["id", "user", "channel", "email", "email_verified_at", "url", "job_in_console", "project", "active", "created_at"]
    list_filter = ["channel", "active"]
    raw_id_fields = ["user", "job", "project"]
    list_select_related = ["user", "job", "project"]

    @admin.display(description="job")
    def job_in_console(self, subscription: Subscription) -> SafeString | str:
        return console_link(subscription.job)


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "subscription", "event", "job_in_console", "kind", "state", "attempts", "last_status", "created_at", "delivered_at"]
    list_filter = ["state", "kind"]
    raw_id_fields = ["subscription", "event"]
    list_select_related = ["subscription", "event__job"]

    @admin.display(description="job")
    def job_in_console(self, delivery: Delivery) -> SafeString | str:
        return console_link(delivery.event.job)
