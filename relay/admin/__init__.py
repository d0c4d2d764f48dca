"""The admin listener: JSON API, metrics, health (and the dashboard)."""

from __future__ import annotations

from aiohttp import web

from relay.admin.api import add_routes, api_guard
from relay.admin.context import OPERATOR, Operator
from relay.admin.dashboard import add_dashboard


def admin_application(operator: Operator) -> web.Application:
    app = web.Application(middlewares=[api_guard], client_max_size=1024 * 1024)
    app[OPERATOR] = operator
    add_routes(app)
    add_dashboard(app, operator)
    return app


__all__ = ["OPERATOR", "Operator", "admin_application"]
