"""The keys a server host and a router host share (CommonSettings)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictBool, StrictStr

from tasks.spec.fields import FROZEN, HttpUrl, PipWheel, SecretEnvName, abs_path


class CommonSettings(BaseModel):
    """Keys of servers (group_data/all.py) and routers (group_data/routers.py)
    alike: how the venv is bootstrapped, and which controller environment
    variable holds the API key. Each host kind adds its own keys."""

    model_config = FROZEN

    venv_python: Annotated[StrictStr, abs_path("e.g. '/usr/bin/python3'")] = Field(
        "/usr/bin/python3", description="absolute path of the interpreter that creates the venv"
    )
    get_pip_url: HttpUrl = Field("https://bootstrap.pypa.io/get-pip.py", description="http(s) URL of get-pip.py")
    pip_wheel: PipWheel | None = Field(
        None, description="path on the controller of a pip *.whl uploaded to offline hosts, or None"
    )
    api_key_env: SecretEnvName | None = Field(
        None, description="NAME of a controller environment variable holding the API key, or None"
    )
    api_key_required: StrictBool = Field(
        True, description="true: a missing api_key_env variable is an error; false: run without a key"
    )
