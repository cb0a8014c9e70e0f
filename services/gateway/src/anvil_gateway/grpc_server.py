"""The gateway's KServe v2 / Triton gRPC endpoint (``inference.GRPCInferenceService``,
proto/grpc_service.proto): a grpc.aio server on the gateway's own event loop, beside uvicorn,
sharing the gateway's state (admission, scheduler link, discovery, shm table), so a gRPC request is
admitted and counted exactly like an HTTP one.

Port ``ANVIL_GRPC_PORT`` (8001, Triton's default; 0: no gRPC endpoint). With ``ANVIL_HTTP_WORKERS``
> 1 every worker serves gRPC on the same port with SO_REUSEPORT, as they share the HTTP port: the
kernel spreads *connections* over them, and a gRPC client multiplexes its calls over one connection,
so one channel's calls all land on one worker (open several channels to use several). A lone gateway
binds without SO_REUSEPORT, so a port already taken is an error at start, not a silent share.

Message size: ``grpc.max_receive_message_length`` is ``max_body_bytes``, the cap every model's limit
stays under (body_limits.py); models come and go while the server runs, so each request's own model
limit is checked in grpc_infer.py. Answers are the executor's outputs, not capped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeAlias, TypeVar

import grpc

from anvil_core.logs import get_logger
from anvil_gateway import grpc_meta as meta
from anvil_gateway.grpc_infer import model_infer, model_stream_infer
from anvil_gateway.grpc_status import abort, metadata
from anvil_gateway.proto_gen import grpc_service_pb2 as pb
from anvil_gateway.proto_gen import grpc_service_pb2_grpc as pb_grpc
from anvil_gateway.request_path import Failed
from anvil_gateway.state import GatewayState

__all__ = ["GrpcFront", "Servicer"]

log = get_logger("anvil.gateway.grpc")
_T = TypeVar("_T")
Context: TypeAlias = grpc.aio.ServicerContext  # type: ignore[type-arg]


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """Every RPC: its function in grpc_infer.py / grpc_meta.py, a `Failed` answered as its gRPC
    status (grpc_status.py), and any other exception (a bug) as INTERNAL without its text, logged."""

    def __init__(self, st: GatewayState) -> None:
        self.st = st

    async def _run(
        self,
        context: Context,
        call: Callable[[], Awaitable[_T] | _T],
        overrides: Mapping[int, grpc.StatusCode] | None = None,
    ) -> _T:
        try:
            result = call()
            return await result if isinstance(result, Awaitable) else result  # type: ignore[return-value]
        except Failed as exc:
            await abort(context, exc, overrides=overrides)
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("grpc call failed")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error (logged by the gateway)")
        raise AssertionError("unreachable: context.abort raises")

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return await self._run(context, lambda: meta.server_ready(self.st))

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        return await self._run(context, lambda: meta.model_ready(self.st, request))

    async def ServerMetadata(self, request: Any, context: Context) -> pb.ServerMetadataResponse:
        return await self._run(context, meta.server_metadata)

    async def ModelMetadata(self, request: Any, context: Context) -> pb.ModelMetadataResponse:
        return await self._run(context, lambda: meta.model_metadata(self.st, request))

    async def ModelConfig(self, request: Any, context: Context) -> pb.ModelConfigResponse:
        return await self._run(context, lambda: meta.model_config(self.st, request))

    async def ModelStatistics(self, request: Any, context: Context) -> pb.ModelStatisticsResponse:
        return await self._run(context, lambda: meta.model_statistics(self.st, request))

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        return await self._run(context, lambda: model_infer(self.st, request, context))

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        async for answer in model_stream_infer(self.st, request_iterator, context):
            yield answer

    async def _caller(self, context: Context, fn: Any, request: Any, codes: Any = None) -> Any:
        """An RPC that acts for the caller's tenant: `fn(state, request, the call's metadata)`."""
        return await self._run(context, lambda: fn(self.st, request, metadata(context)), codes)

    async def RepositoryIndex(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.repository_index, request)

    async def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.repository_load, request)

    async def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.repository_unload, request)

    async def SystemSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.shm_status, request)

    async def SystemSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.shm_register, request, meta.SHM_REGISTER_CODES)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.shm_unregister, request, meta.SHM_UNREGISTER_CODES)

    async def CudaSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.cuda_shm_status, request)

    async def CudaSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.cuda_shm_register, request)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        return await self._caller(context, meta.cuda_shm_unregister, request)


class GrpcFront:
    """The gRPC server of one gateway process; started and stopped by the app's lifespan."""

    def __init__(self, st: GatewayState, shared_port: bool = False) -> None:
        self.st = st
        self.shared_port = shared_port  # several worker processes bind the port (SO_REUSEPORT)
        self.server: grpc.aio.Server | None = None
        self.port = 0  # bound port; 0 while not serving

    async def start(self) -> None:
        s = self.st.settings
        if s.grpc_port == 0:
            return
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", s.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1 if self.shared_port else 0),
            ]
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(self.st), self.server)
        host = f"[{s.bind_host}]" if ":" in s.bind_host else s.bind_host
        self.port = self.server.add_insecure_port(f"{host}:{s.grpc_port}")  # RuntimeError when taken
        await self.server.start()
        log.info("grpc serving", extra={"port": self.port, "shared_port": self.shared_port})

    async def stop(self, grace_s: float = 5.0) -> None:
        if self.server is not None:
            await self.server.stop(grace_s)
            self.server = None
            self.port = 0
