from django.contrib import admin

from notify.models import Delivery, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ["id", "user", "channel", "email", "email_verified_at", "url", "job", "project", "active", "created_at"]
    list_filter = ["channel", "active"]
    raw_id_fields = ["user", "job", "project"]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "subscription", "event", "kind", "state", "attempts", "last_status", "created_at", "delivered_at"]
    list_filter = ["state", "kind"]
    raw_id_fields = ["subscription", "event"]
