"""Python stubs of protos/dlm/v1/dlm.proto, generated into the git-ignored _proto/ when missing or older than it.

`python -m services.serving.protogen` generates them ahead of time; `load()` does so on first import.
"""

import importlib
import os
import shutil
import sys
import tempfile
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIR = os.path.join(ROOT, "protos")
PROTO = os.path.join("dlm", "v1", "dlm.proto")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_proto")
STUBS = ("dlm_pb2.py", "dlm_pb2_grpc.py", "dlm_pb2.pyi")


def stale() -> bool:
    source = os.path.getmtime(os.path.join(PROTO_DIR, PROTO))
    paths = [os.path.join(OUT, "dlm", "v1", name) for name in STUBS]
    return not all(os.path.exists(p) and os.path.getmtime(p) >= source for p in paths)


def generate() -> None:
    from grpc_tools import protoc

    well_known = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    os.makedirs(OUT, exist_ok=True)
    # generate aside, then move file by file: concurrent importers never see half-written stubs
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        args = ["protoc", f"-I{PROTO_DIR}", f"-I{well_known}"]
        args += [f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", PROTO]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {os.path.join(PROTO_DIR, PROTO)}")
        target = os.path.join(OUT, "dlm", "v1")
        os.makedirs(target, exist_ok=True)
        for pkg in (os.path.join(OUT, "dlm"), target):
            open(os.path.join(pkg, "__init__.py"), "a").close()
        for name in STUBS:
            shutil.move(os.path.join(tmp, "dlm", "v1", name), os.path.join(target, name))


def load() -> tuple[ModuleType, ModuleType]:
    """(dlm_pb2, dlm_pb2_grpc), generating them first when needed."""
    if stale():
        generate()
    # protoc's grpc stubs import their messages as the top-level package `dlm.v1`
    if OUT not in sys.path:
        sys.path.insert(0, OUT)
    return importlib.import_module("dlm.v1.dlm_pb2"), importlib.import_module("dlm.v1.dlm_pb2_grpc")


if __name__ == "__main__":
    generate()
    print(f"stubs written to {os.path.join(OUT, 'dlm', 'v1')}")
