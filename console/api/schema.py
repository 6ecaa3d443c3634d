"""The OpenAPI schema view: JSON first, so a browser shows the schema instead of downloading it
(YAML stays available with ``Accept: application/vnd.oai.openapi`` or ``?format=yaml``)."""

from __future__ import annotations

from drf_spectacular.renderers import OpenApiJsonRenderer, OpenApiJsonRenderer2, OpenApiYamlRenderer, OpenApiYamlRenderer2
from drf_spectacular.views import SpectacularAPIView


class SchemaView(SpectacularAPIView):
    renderer_classes = [OpenApiJsonRenderer2, OpenApiJsonRenderer, OpenApiYamlRenderer, OpenApiYamlRenderer2]
