"""trio-responses: an OpenAI-compatible Responses API server for gpt-oss, on Trio.

Public API (everything else is private)::

    serve(config, *, task_status)        run the HTTP server in your nursery
    open_responses_service(config)       the service without HTTP
    Config                               every setting, with defaults
"""

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
from ._serve import serve as serve
from ._serve import serve_service as serve_service
from ._service import ResponsesService as ResponsesService
from ._service import open_responses_service as open_responses_service

__version__ = "0.1.0"
