"""results/query.py: where rows ran (``placement``)."""

import pandas as pd

from freezesweep.results.query import NODE_COLUMNS, placement


def _rows(*placed: tuple) -> pd.DataFrame:
    """Rows of ``NODE_COLUMNS`` from (node_id, hostname, node, status) each."""
    rows = [
        {c: None for c in NODE_COLUMNS} | {"node_id": i, "hostname": h, "node": n, "status": s} for i, h, n, s in placed
    ]
    return pd.DataFrame(rows, columns=NODE_COLUMNS)


def test_failed_rows_without_a_node_id_are_no_node_of_their_own():
    """A walk-through's one machine: "rows ran on 2 node(s)", its failed rows (no node id, host vm) counted
    as a node "host vm" beside the Ray node the ok rows name."""
    rows = _rows(
        ("n1", "vm", "vm", "ok"),
        ("n1", "vm", "vm", "ok"),
        (None, "vm", "vm", "failed"),  # host in both columns, as a failed row may hold it
        (None, None, "vm", "failed"),  # host in ``node`` alone
        (None, None, None, "failed"),  # no placement at all
    )
    nodes = placement(rows)
    assert nodes["node"].tolist() == ["n1"] and nodes["rows"].tolist() == [2], nodes


def test_rows_from_before_node_ids_still_count_one_node_per_host():
    rows = _rows(("n1", "gpu-host", "gpu-host", "ok"), (None, None, "old-host", "ok"), (None, None, "old-host", "ok"))
    nodes = placement(rows).set_index("node")
    assert sorted(nodes.index) == ["host old-host", "n1"] and nodes.loc["host old-host", "rows"] == 2


def test_rows_that_name_no_node_at_all_are_one_unknown_node():
    """They ran somewhere: one node at least, which no row names."""
    nodes = placement(_rows((None, None, None, "failed"), (None, None, None, "failed")))
    assert nodes["node"].tolist() == ["unknown"] and nodes["rows"].tolist() == [2]
