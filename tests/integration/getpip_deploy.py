"""Only the venv and its pip, bootstrapped with get-pip.py from $SGC_GET_PIP_URL
(no ensurepip on the host, no uploaded wheel): for test_get_pip.py."""

import os

from core.venv_ops import pip_bootstrapped, venv

PATH = os.environ["SGC_VENV"]

venv(path=PATH, python="/usr/bin/python3", name=f"venv {PATH}")
pip_bootstrapped(path=PATH, get_pip_url=os.environ["SGC_GET_PIP_URL"], pip_wheel=None, name="pip works")
