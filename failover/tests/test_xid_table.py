"""The one Xid table: docs/failover.md shows what the code judges, the monitor kills on the
catalogue's reset / reboot Xids, and the issue's misjudgements stay fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from failover.xids import CATALOG, FATAL_XIDS, SXIDS, XIDS, bus_id, markdown_table, parse_kernel_line

DOCS = Path(__file__).resolve().parents[2] / "docs" / "failover.md"


def test_the_docs_show_the_table_the_code_judges_by():
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("<!-- xid-table:start -->\n") + len("<!-- xid-table:start -->\n")
    end = text.index("\n<!-- xid-table:end -->")
    assert text[start:end] == markdown_table(), "run `python -m failover.xids` and paste it into docs/failover.md"


def test_every_catalogued_code_has_a_row_with_its_source():
    assert {entry["code"] for entry in CATALOG["xids"]} == set(XIDS)
    assert CATALOG["source"]["commit"] and CATALOG["source"]["repo"] == "https://github.com/leptonai/gpud"
    for rule in XIDS.values():
        assert rule.source and rule.cls in {"hardware", "application", "remap", "recovery", "nvlink5", "ignore"}
        assert rule.scope in {"gpu", "node", ""}
        assert not rule.fatal or rule.cls == "hardware"


def test_every_reset_gpu_and_restart_xid_of_the_catalogue_ends_the_run():
    for code in (46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158, 79, 151):
        assert code in FATAL_XIDS, code
    for code in (13, 31, 43, 45, 48, 63, 94, 121, *range(144, 151)):
        assert code not in FATAL_XIDS, code


def test_gpu_reset_xids_are_gpu_scoped_and_reboots_node_scoped():
    assert XIDS[95].scope == XIDS[64].scope == XIDS[119].scope == "gpu"
    assert XIDS[151].scope == XIDS[167].scope == XIDS[173].scope == "node"
    assert XIDS[94].scope == ""


@pytest.mark.parametrize(
    "address,expected",
    [
        ("0008:01:00", "0008:01:00"),
        ("00000008:01:00.0", "0008:01:00"),
        ("PCI:0019:01:00.0", "0019:01:00"),
        ("0000:3B:00.0", "0000:3b:00"),
        ("3b:00", "0000:3b:00"),
    ],
)
def test_bus_ids_keep_their_domain(address, expected):
    assert bus_id(address) == expected


@pytest.mark.parametrize(
    "line",
    [
        "Xid (3b:00): 79[4242]: segfault at 0 ip 0000000000401136 sp 00007ffd3d1f6d10 error 6 in a.out[401000+1000]",
        "[ 812.1] Xid (3b:00): 79[4242]: segfault at 0 ip 0000000000401136 sp 00007ffd3d1f6d10 error 6",
        "NVRM: Xid (PCI[4242]: segfault at 0 ip 0000000000401136 sp 00007ffd3d1f6d10 error 6",
        "GPU is lost[4242]: segfault at 0 ip 0000000000401136 sp 00007ffd3d1f6d10 error 6",
        "python3[4242]: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
        'audit: type=1701 comm="Xid (3b:00): 79" exe="/usr/bin/python3" sig=11 res=1',
    ],
)
def test_a_process_name_never_becomes_an_xid(line):
    assert parse_kernel_line(line) is None


def test_nvswitch_sxids_are_read_with_the_severity_the_driver_printed():
    fatal = parse_kernel_line("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up")
    non_fatal = parse_kernel_line("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error")
    assert (fatal.kind, fatal.code, fatal.severity, fatal.fatal) == ("sxid", 20034, "Fatal", True)
    assert (non_fatal.kind, non_fatal.code, non_fatal.severity, non_fatal.fatal) == ("sxid", 12028, "Non-fatal", False)
    assert SXIDS[12028].hardware and SXIDS[20034].hardware


def test_nvlink5_xids_are_fatal_only_as_printed():
    nonfatal = parse_kernel_line("NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 05 (0x00000013 0x00000000 0x00000000 0x00000000)")
    fatal = parse_kernel_line(
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 05 (0x00000011 0x00000000 0x00000000 0x00000000)"
    )
    assert (nonfatal.severity, nonfatal.fatal, nonfatal.pci) == ("Nonfatal", False, "0018:01:00")
    assert (fatal.severity, fatal.fatal) == ("Fatal", True)


def test_only_infiniband_ports_count_as_nic_link_failures():
    ib = parse_kernel_line("mlx5_core 0000:5e:00.0 mlx5_0: Link down")
    eth = parse_kernel_line("mlx5_core 0000:0c:00.0 enp12s0np0: Link down")
    assert ib is not None and (ib.kind, ib.nic) == ("network_link_down", "mlx5_0")
    assert eth is None or eth.kind != "network_link_down"
