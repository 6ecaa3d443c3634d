from django.urls import path

from failover import api

urlpatterns = [
    path("nodes/<str:name>/inject-fault/", api.InjectFaultView.as_view(), name="node-inject-fault"),
    path("nodes/<str:name>/clear/", api.ClearNodeView.as_view(), name="node-clear"),
    path("nodes/<str:name>/reclaim-spot/", api.ReclaimSpotView.as_view(), name="node-reclaim-spot"),
]
