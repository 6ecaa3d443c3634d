from rest_framework.routers import SimpleRouter

from notify.api import SubscriptionViewSet

router = SimpleRouter()
router.register("notifications/subscriptions", SubscriptionViewSet, basename="notification-subscription")
urlpatterns = router.urls
