"""``python -m zerolayer.frontend --listen HOST:PORT --loader unix:PATH --scheduler unix:PATH``
(``--scheduler`` repeated, or a comma list, for several schedulers)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from zerolayer.common.access import plaintext_tokens_warning, read_server_tls, read_tenants
from zerolayer.common.clients import fetch_manifest
from zerolayer.common.config import FrontendConfig
from zerolayer.common.layer_main import LayerProgram, main
from zerolayer.common.metrics import serve_metrics
from zerolayer.common.server import run_layer
from zerolayer.common.setting import SettingError
from zerolayer.common.settings import HTTP_LISTEN, PUBLIC_MAX_MESSAGE_BYTES, TLS_CLIENT_CA
from zerolayer.common.tracing import Tracing
from zerolayer.frontend.generation import TextGenerator
from zerolayer.frontend.kserve.server import kserve_binding
from zerolayer.frontend.metrics import FrontendMetrics, RequestCountingInterceptor
from zerolayer.frontend.public_health import FrontendServer
from zerolayer.frontend.routing.router import Router
from zerolayer.frontend.routing.scheduler_client import SchedulerClient
from zerolayer.frontend.routing.scheduler_pool import SchedulerPool, Waits
from zerolayer.frontend.tenants import TenantPolicy
from zerolayer.frontend.text_generation.server import text_generation_binding

if TYPE_CHECKING:
    from zerolayer.frontend.http_server import HttpServer

log = logging.getLogger(__name__)

PUBLIC_MAX_RECEIVE_BYTES = PUBLIC_MAX_MESSAGE_BYTES
"""Largest public request accepted; prompts are far smaller (see
text.validation.check_text_length)."""
STARTUP_SCHEDULER_WAIT_S = 30.0
"""How long a starting frontend waits to see a scheduler serve before it reports SERVING (on its
instance name; its public names say SERVING only while a scheduler does), seconds."""


def http_server(config: FrontendConfig) -> HttpServer | None:
    """The HTTP server of ``--http-listen`` (the OpenAI-compatible API and Anthropic's Messages
    API), its socket bound; None: off.

    Raises:
        SettingError: the address cannot be bound, or ``--tls-client-ca`` is set (the HTTP
            server does not see client certificates, which would then identify callers).
    """
    if not config.http_listen:
        return None
    if config.tls_client_ca:
        raise SettingError(HTTP_LISTEN, f"cannot be combined with {TLS_CLIENT_CA.flag}")
    # NOTE: imported here, as is FastAPI (openai.app): they take about a second of CPU at
    # start-up, which a frontend without --http-listen does not spend (issue 18, cold start).
    from zerolayer.frontend.http_server import HttpServer, HttpServerConfig

    return HttpServer(
        HttpServerConfig(config.http_listen, config.reuse_port, config.tls_cert, config.tls_key)
    )


def scheduler_pool(
    config: FrontendConfig, tracing: Tracing, on_change: Callable[[], None]
) -> SchedulerPool:
    """The schedulers of ``config`` behind one router that calls ``on_change`` when whether one
    can take requests may have changed (nothing connects yet)."""
    router = Router(config.scheduler_address, config.routing, on_change)
    clients = {
        a: SchedulerClient(a, tracing=tracing, hung_after_s=config.scheduler_hung_after_s)
        for a in config.scheduler_address
    }
    return SchedulerPool(clients, router, Waits(config.scheduler_wait_s, config.failover_wait_s))


async def serve(config: FrontendConfig, tracing: Tracing) -> None:
    """Loads the tokenizer from the loader, then serves until SIGTERM; its public health follows
    the schedulers' (see zerolayer.frontend.public_health).

    Raises:
        SettingError: a TLS file or the tenants file cannot be used (zerolayer.common.access),
            or ``--http-listen`` cannot be served (:func:`http_server`), before anything else
            (a tenants file without TLS is one WARNING).
    """
    # NOTE: first, so that a bad file fails before any wait
    tls = read_server_tls(config)
    tenants = TenantPolicy(
        read_tenants(config.tenants) if config.tenants else None,
        client_certificates=tls is not None and tls.client_ca is not None,
    )
    if (warning := plaintext_tokens_warning(config.tenants, config.tls_cert)) is not None:
        log.warning("%s", warning)
    http = http_server(config)
    manifest = await asyncio.to_thread(fetch_manifest, config.loader_address)
    pool = scheduler_pool(config, tracing, lambda: server.health_changed())
    metrics = FrontendMetrics(
        serve_metrics(config.metrics_port, host=config.metrics_host, collectors=[])
    )
    generator = TextGenerator(config, manifest, pool, tracing.tracer, metrics)
    server = FrontendServer(
        config.listen,
        [text_generation_binding(generator, tenants), kserve_binding(generator, tenants)],
        max_receive_bytes=PUBLIC_MAX_RECEIVE_BYTES,
        tracing=tracing,
        starts_traces=True,
        interceptors=[RequestCountingInterceptor(metrics, ("/zerolayer.", "/inference."))],
        instance_id=config.instance_id,
        reuse_port=config.reuse_port,
        private_address=config.private_address,
        credentials=tls.credentials() if tls is not None else None,
        ready=lambda: pool.router.available,
        on_public_health=metrics.serving.set,
    )

    background: set[asyncio.Task] = set()
    """Start-up work that serving does not wait for (held until it ends)."""
    # NOTE: bearer tokens alone: the HTTP server sees no client certificates (see http_server)
    http_tenants = TenantPolicy(tenants.token_tenants)

    async def on_start() -> None:
        if http is not None:
            from zerolayer.frontend.anthropic.app import add_routes
            from zerolayer.frontend.openai.app import create_app
            from zerolayer.frontend.responses.app import add_responses_routes
            from zerolayer.frontend.responses.store import ResponseStore

            app = create_app(generator, http_tenants, tracing, PUBLIC_MAX_RECEIVE_BYTES)
            add_routes(app, generator, http_tenants, tracing, PUBLIC_MAX_RECEIVE_BYTES)
            store = ResponseStore(
                config.responses_max_stored,
                config.responses_max_age_s,
                on_drop=lambda entry, _: generator.kv_pins.release_soon(entry.pin_ids),
            )
            add_responses_routes(
                app, generator, store, http_tenants, tracing, PUBLIC_MAX_RECEIVE_BYTES
            )
            await http.start(app)
        for client in pool.clients.values():
            client.watch_health(pool.router)
        if tenants.token_tenants is not None and not tenants.client_certificates:
            # NOTE: in the background: a kvstore still starting must not delay serving
            background.add(
                asyncio.create_task(
                    generator.kv_pins.release_other_tenants(set(tenants.token_tenants.values()))
                )
            )
        # NOTE: a frontend started with its schedulers reports SERVING once it has seen one
        # serve (the channel's reconnect backoff can delay that by a second), so that a stack
        # that is "up" answers at once; without any, it serves anyway after the bound.
        await pool.router.wait_available(STARTUP_SCHEDULER_WAIT_S)

    async def on_stop() -> None:
        if http is not None:
            await http.stop()
        await pool.close()
        await generator.kv_pins.close()

    await run_layer(server, on_start=on_start, on_stop=on_stop)


PROGRAM = LayerProgram("frontend", FrontendConfig, serve, __doc__)

if __name__ == "__main__":
    sys.exit(main(PROGRAM))
