"""Regenerate ``failover/catalog/nvidia.json`` from a checkout of leptonai/gpud (standard library only).

    python -m failover.catalog.generate /path/to/gpud > failover/catalog/nvidia.json

Three Go files of gpud hold what this reads: ``components/accelerator/nvidia/xid/catalog_generated.go``
(NVIDIA's Xid catalogue, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, sheet "Catalog":
mnemonic, description, immediate and investigatory resolution of every Xid), ``xid/xid.go`` (gpud's
repair action per Xid, used where the catalogue leaves the resolution empty: 162-173) and
``sxid/sxid.go`` (NVSwitch SXids from NVIDIA's Fabric Manager user guide: name, whether always fatal
to the fabric). Nothing is judged here; ``failover.xids`` derives the verdicts from these facts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SOURCE_REPO = "https://github.com/leptonai/gpud"
XID_CATALOG = "components/accelerator/nvidia/xid/catalog_generated.go"
XID_DETAILS = "components/accelerator/nvidia/xid/xid.go"
SXID_DETAILS = "components/accelerator/nvidia/sxid/sxid.go"

_ENTRY = re.compile(
    r'\{Code: (\d+), Mnemonic: "((?:[^"\\]|\\.)*)", Description: "((?:[^"\\]|\\.)*)", '
    r'ImmediateResolution: "((?:[^"\\]|\\.)*)", InvestigatoryResolution: "((?:[^"\\]|\\.)*)"\}'
)
_BLOCK = re.compile(r"^\t(\d+): \{\n(.*?)^\t\},", re.S | re.M)
_ACTION = re.compile(r"apiv1\.RepairActionType(\w+)")
_NAME = re.compile(r'\bName:\s+"((?:[^"\\]|\\.)*)"')
_ALWAYS = re.compile(r"defaultAlwaysFatalErr|AlwaysFatal:\s+true")


def _go(text: str) -> str:
    return json.loads(f'"{text}"')


def generate(root: Path) -> dict:
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=False, capture_output=True, text=True).stdout.strip()
    catalog = (root / XID_CATALOG).read_text()
    details = (root / XID_DETAILS).read_text()
    sxids = (root / SXID_DETAILS).read_text()
    actions = {int(code): sorted(set(_ACTION.findall(body))) for code, body in _BLOCK.findall(details)}
    xids: list[dict] = [
        {
            "code": int(code),
            "mnemonic": _go(mnemonic).replace("\n", " "),
            "description": _go(description).replace("\n", " "),
            "immediate": _go(immediate).replace("\n", " "),
            "investigatory": _go(investigatory).replace("\n", " "),
            "gpud_actions": actions.get(int(code), []),
        }
        for code, mnemonic, description, immediate, investigatory in _ENTRY.findall(catalog)
    ]
    known = {x["code"] for x in xids}
    for code in sorted(set(actions) - known):  # gpud knows it, the catalogue sheet does not yet (173)
        xids.append({"code": code, "mnemonic": "", "description": "", "immediate": "", "investigatory": "", "gpud_actions": actions[code]})
    descriptions = {int(c): re.search(r'Description:\s+"((?:[^"\\]|\\.)*)"', b) for c, b in _BLOCK.findall(details)}
    for entry in xids:
        found = descriptions.get(int(entry["code"]))
        if not entry["description"] and found:
            entry["description"] = _go(found[1])
    switch = []
    for code, body in _BLOCK.findall(sxids):
        name = _NAME.search(body)
        switch.append(
            {
                "code": int(code),
                "name": _go(name[1]) if name else "",
                "always_fatal": bool(_ALWAYS.search(body)),
                "gpud_actions": sorted(set(_ACTION.findall(body))),
            }
        )
    return {
        "source": {
            "repo": SOURCE_REPO,
            "commit": commit,
            "files": [XID_CATALOG, XID_DETAILS, SXID_DETAILS],
            "catalogue": "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
            "sxid_guide": "https://docs.nvidia.com/datacenter/tesla/pdf/fabric-manager-user-guide.pdf",
        },
        "xids": sorted(xids, key=lambda x: x["code"]),
        "sxids": sorted(switch, key=lambda x: x["code"]),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m failover.catalog.generate /path/to/gpud-checkout")
    json.dump(generate(Path(sys.argv[1])), sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")
