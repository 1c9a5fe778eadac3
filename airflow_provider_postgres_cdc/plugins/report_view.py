"""The "Postgres CDC" view of the Airflow UI: every configured pipeline's report, read-only.

Built on Airflow 3's plugin interface as a FastAPI app (``fastapi_apps``, mounted by the API
server at ``/postgres-cdc``) plus an external view (``external_views``) that puts it in the UI's
navigation, embedded in the UI's own frame. A React app would need a JavaScript build and
bundle; the report is already a server-rendered page (the same one ``pgcdc report --html``
writes), so serving it from the API server keeps one renderer and no build step.

Access goes through Airflow's own authentication and the configured auth manager: the user comes
from the API server's JWT (cookie or bearer token, ``get_user`` as Airflow's routes use it); the
page needs the custom view ``postgres-cdc`` (GET), and a pipeline is shown only to a user who may
read both of its connections (it is read through them). Anyone else gets 401/403 and nothing of
the page. Connection secrets are used server-side only; the page shows connection ids at most.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import HTMLResponse

from airflow_provider_postgres_cdc.plugins.pipelines import (
    EXAMPLE,
    VARIABLE,
    PipelineSpec,
    ack_points,
    configured_pipelines,
)
from airflow_provider_postgres_cdc.replication.connection import connection_lost_detail

if TYPE_CHECKING:
    from airflow_provider_postgres_cdc.engine.report import PipelineReport

RESOURCE = "postgres-cdc"
URL_PREFIX = "/postgres-cdc"
TITLE = "Postgres CDC pipelines"


def _allowed(spec: PipelineSpec, user: Any) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails

    manager = get_auth_manager()
    return all(
        manager.is_authorized_connection(method="GET", details=ConnectionDetails(conn_id=conn_id), user=user)
        for conn_id in (spec.postgres_conn_id, spec.lake_conn_id)
    )


def _report(spec: PipelineSpec) -> PipelineReport | str:
    """The pipeline's report, or a sentence when its connections cannot even be resolved."""
    # Imported here: the report reads the lake (pyiceberg, pyarrow), which every Airflow process
    # that loads plugins would otherwise import.
    from airflow_provider_postgres_cdc.engine.report import collect_report
    from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
    from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook

    try:
        params = PostgresCdcHook(spec.postgres_conn_id).connection_params()
        lake = PostgresCdcLakeHook(spec.lake_conn_id).get_conn()
    except Exception as exc:  # a missing or malformed connection: said, never raised into the page
        first = connection_lost_detail(exc)[:300]
        return (
            f"pipeline of slot {spec.slot_name!r}: connection {spec.postgres_conn_id!r} or "
            f"{spec.lake_conn_id!r}: {first}"
        )
    notes: list[str] = []
    try:
        acks = ack_points(lake.catalog, spec.slot_name)
    except Exception as exc:  # the metadata database is the API server's own; still, say it
        acks = []
        notes.append(f"the Airflow metadata of acks could not be read: {type(exc).__name__}")
    return collect_report(
        params,
        spec.slot_name,
        lake,
        publications=spec.publications,
        acks=acks,
        timeout=spec.timeout,
        notes=notes,
    )


async def current_user(request: Request) -> Any:
    """The request's user exactly as Airflow's own routes resolve it (bearer token, else the JWT cookie).

    Airflow's ``get_user`` is imported on the first request, not with the plugin: every Airflow
    process loads plugins, and the API server's security module takes about 1.5 s to import.
    """
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    return await get_user(request, None, await bearer_scheme(request))


def create_app() -> FastAPI:
    """The view's FastAPI app (mounted by the API server under :data:`URL_PREFIX`)."""
    app = FastAPI(title=TITLE, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def view(user: Annotated[Any, Depends(current_user)]) -> HTMLResponse:
        from airflow.api_fastapi.app import get_auth_manager

        from airflow_provider_postgres_cdc.engine.report import render_html

        if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=RESOURCE, user=user):
            raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden")
        messages: list[str] = []
        try:
            specs = configured_pipelines()
        except Exception as exc:
            specs, messages = [], [str(exc)]
        allowed = [spec for spec in specs if _allowed(spec, user)]
        if specs and not allowed:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden")
        if not specs and not messages:
            messages.append(
                f"no pipeline is configured: set the Airflow Variable {VARIABLE} to a JSON list like "
                f"{EXAMPLE}"
            )
        reports: list[PipelineReport] = []
        for spec in allowed:
            result = _report(spec)
            if isinstance(result, str):
                messages.append(result)
            else:
                reports.append(result)
        return HTMLResponse(render_html(reports, TITLE, messages), headers={"Cache-Control": "no-store"})

    return app


class PostgresCdcReportPlugin(AirflowPlugin):
    """Registers the view's app and its place in the UI's navigation."""

    name = "postgres_cdc"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Postgres CDC report"}]
    external_views = [
        {
            "name": "Postgres CDC",
            "href": f"{URL_PREFIX}/",
            "url_route": "postgres-cdc",
            "destination": "nav",
            "category": "browse",
        }
    ]
