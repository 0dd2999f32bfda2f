"""tools/predict.py and what it reads of the probe (tools/allreduce.py): each term of a predicted
step on its own, in process, on a probe written here; the probe under mpirun at np=4 on this
host (too small a model to show loopback's rate), its file read by `python -m tools.predict`
with the link given; and the one-line refusals."""
import json
import math

import pytest

from helpers import PY, assert_ok, run
from tools import allreduce, layer_profile, predict, scaling_model


@pytest.fixture(scope="module")
def probe():
    """A probe's figures as tools.allreduce writes them, for LeNet at batch 8 on this CPU: a
    100 Mbit/s link fitted at 4 processes on 2 hosts, spread 0.05, steps of 10 to 13 ms. The
    profile's layers and bytes are LeNet's, its times fixed (1 ms forward and 1 ms backward a
    layer): measured ones vary with the machine's load, and every term with them."""
    measured = layer_profile.measure("lenet", 8, steps=2)
    profile = dict(measured, layers=[dict(layer, forward_s=1e-3, backward_s=1e-3) for layer in measured["layers"]],
                   tail_s=0.0, optimizer_s=5e-4)
    profile["forward_s"], profile["backward_s"], _ = layer_profile.totals(profile)
    profile["step_s"] = profile["forward_s"] + profile["backward_s"] + profile["optimizer_s"]
    return {"n": 4, "hosts": 2, "device": "cpu", "bandwidth_bps": 1e8, "latency_s": 1e-4, "spread": 0.05,
            "tensor_bytes": [b for layer in profile["layers"] for b in layer["bytes"]], "profile": profile,
            "step_times_s": [0.010, 0.010, 0.011, 0.012, 0.013], "backward_alone_s": 0.004,
            "backward_beside_allreduce_s": 0.006, "request_s": 20e-6, "cycle_s": 1e-3}


def rows(probe, **kw):
    point, params, times, notes = predict.job_point(probe, kw.pop("nodes", 4), kw.pop("gpus", 2), **kw)
    return dict((name, s) for name, s, _ in predict.terms(point, params, probe, times, kw.get("path", "hooks"))), \
        point, params


def test_the_wire_cycle_and_spread_terms_add_up_to_the_models_step(probe):
    got, point, params = rows(probe, step_s=0.01)
    assert got["compute"] == pytest.approx(0.01)
    model = scaling_model.step_s(point, params)
    assert got["compute"] + got["allreduce not hidden"] + got["Horovod's cycle"] + got["ring's growth with N"] \
        == pytest.approx(model)
    assert got["Horovod's cycle"] > 0 and got["ring's growth with N"] > 0
    # The probe's bandwidth at its own 4 processes holds their stretch: the model's ring of 2 is faster.
    assert point["rate_bps"] == pytest.approx(1e8 * (1 + 0.05 * math.log2(4 / 2)))
    ddp, _, _ = rows(probe, step_s=0.01, port="ddp")
    assert "Horovod's cycle" not in ddp and ddp["host work per request"] == 0


def test_the_spread_term_grows_with_n_and_is_nothing_without_a_spread(probe):
    grow = [rows(probe, nodes=nodes, step_s=0.001)[0]["ring's growth with N"] for nodes in (2, 8, 32)]
    assert grow[0] < grow[1] < grow[2]
    flat, _, _ = rows(dict(probe, spread=None), nodes=32, step_s=0.001)
    assert flat["ring's growth with N"] == 0


def test_host_work_is_a_request_per_tensor_on_the_hooks_and_one_on_the_path_one(probe):
    tensors = len(probe["tensor_bytes"])
    assert rows(probe)[0]["host work per request"] == pytest.approx(tensors * 20e-6)
    one, _, _ = rows(probe, compiled=True, path="one")
    assert one["host work per request"] == pytest.approx(20e-6)


def test_the_slowest_of_n_is_the_expected_largest_draw_less_the_median(probe):
    assert predict.expected_slowest([1, 2, 3, 4], 1) == pytest.approx(2.5)  # one draw: the mean
    assert predict.expected_slowest([1, 2, 3, 4], 2) == pytest.approx((1 * 1 + 2 * 3 + 3 * 5 + 4 * 7) / 16)
    assert predict.expected_slowest([1, 2, 3, 4], 200) == pytest.approx(4)
    got, point, _ = rows(probe, nodes=8, gpus=1)  # the probe's own steps: median 11 ms
    assert got["wait for the slowest of N"] == pytest.approx(predict.expected_slowest(probe["step_times_s"], 8) - 0.011)
    even, _, _ = rows(dict(probe, step_times_s=[0.01] * 5), nodes=8)
    assert even["wait for the slowest of N"] == pytest.approx(0, abs=1e-12)


def test_compute_slowed_beside_the_allreduce_is_the_overlapped_backward_times_the_slowdown(probe):
    got, point, params = rows(probe, step_s=0.01, nodes=2, gpus=1)
    total = scaling_model.message_s(2, sum(point["tensors"]), point["rate_bps"], params)
    hidden = min(point["backward_s"], total - (scaling_model.step_s(point, params) - 0.01))
    assert hidden > 0 and got["compute slowed beside the allreduce"] == pytest.approx(0.5 * hidden)
    alike, _, _ = rows(dict(probe, backward_beside_allreduce_s=0.004), step_s=0.01, nodes=2, gpus=1)
    assert alike["compute slowed beside the allreduce"] == 0


def test_hierarchical_is_a_ring_of_nodes_between_two_steps_inside_them():
    params = (0.9, 1e-5, 0.1)
    flat = scaling_model.message_s(8, 1e8, 1e10, params)
    assert scaling_model.message_s(8, 1e8, 1e10, params, nodes=8, intra_bps=1e12) == pytest.approx(flat)
    across = scaling_model.message_s(4, 1e8, 1e10, params)  # its stretch is a ring of 4's
    inside = 2 * 7 / 8 * 1e8 * 8 / (1e12 * 0.9)
    assert scaling_model.message_s(32, 1e8, 1e10, params, nodes=4, intra_bps=1e12) == pytest.approx(across + inside)
    assert scaling_model.message_s(32, 1e8, 1e10, params, nodes=4, intra_bps=1e12) < \
        scaling_model.message_s(32, 1e8, 1e10, params)
    assert scaling_model.message_s(32, 1e8, 1e10, params, nodes=4, intra_bps=1e12, intra_latency_s=2e-5) == \
        pytest.approx(across + inside + 2e-5)
    # No intra_bps: the node's links taken as free (the emulator's loopback), its latency kept.
    assert scaling_model.message_s(32, 1e8, 1e10, params, nodes=4, intra_latency_s=2e-5) == pytest.approx(across + 2e-5)


def test_a_tree_is_bounded_by_its_busiest_link_and_filled_segment_by_segment():
    params, seg, wire = (0.9, 1e-5), scaling_model.TREE_SEGMENT_BYTES, 8 / (1e10 * 0.9)
    # One binary tree: the root takes 2 children's bytes up, then sends them twice down (1 child at 2);
    # a pipeline of d hops adds d - 1 segments each way (none at 2 processes, one hop).
    assert scaling_model.message_s(2, 1e8, 1e10, params, algorithm="binary-tree") == \
        pytest.approx(1e-5 + 2 * 1e8 * wire)
    assert scaling_model.message_s(8, 1e8, 1e10, params, algorithm="binary-tree") == \
        pytest.approx(1e-5 + (4 * 1e8 + 2 * 2 * 2 * seg) * wire)
    # NCCL's double tree: half the bytes a tree, both phases at once.
    assert scaling_model.message_s(2, 1e8, 1e10, params, algorithm="tree") == \
        pytest.approx(1e-5 + 1e8 * wire)
    assert scaling_model.message_s(16, 1e8, 1e10, params, algorithm="tree") == \
        pytest.approx(1e-5 + (2 * 1e8 + 2 * 3 * seg) * wire)
    # Across nodes the tree spans the nodes; the spread stretches its wire as a ring's.
    assert scaling_model.message_s(32, 1e8, 1e10, params, nodes=4, algorithm="tree") == \
        pytest.approx(scaling_model.message_s(4, 1e8, 1e10, params, algorithm="tree"))
    stretched = scaling_model.message_s(16, 1e8, 1e10, params + (0.1,), algorithm="tree")
    assert stretched - 1e-5 == pytest.approx((2 * 1e8 + 2 * 3 * seg) * wire * (1 + 0.1 * 3))
    with pytest.raises(ValueError, match="not 'Tree'"):
        scaling_model.message_s(8, 1e8, 1e10, params, algorithm="Tree")
    # A large message: the ring's 2 (N - 1) / N beats either tree's.
    assert scaling_model.message_s(8, 1e8, 1e10, params) < scaling_model.message_s(8, 1e8, 1e10, params,
                                                                                   algorithm="tree")


def test_the_tree_is_an_option_of_the_prediction(probe, capsys):
    tree, point, params = rows(probe, algorithm="tree")
    ring, _, _ = rows(probe)
    assert point["algorithm"] == "tree" and point["nodes"] == 4
    assert tree["allreduce not hidden"] != ring["allreduce not hidden"] and tree["compute"] == ring["compute"]
    assert predict.main(["--nodes", "4", "--gpus-per-node", "2", "--link-gbps", "1", "--step-ms", "5",
                         "--arch", "lenet", "--batch", "8", "--algorithm", "tree"]) == 0
    assert "tree of 4 nodes, 1 Gbit/s" in capsys.readouterr().out
    one, point, _ = rows(probe, nodes=1, gpus=8, algorithm="tree")  # one node: a tree of its GPUs
    assert point.get("nodes") is None and one["allreduce not hidden"] > 0


def test_hierarchical_takes_the_nodes_ring_from_the_probe_or_the_flag(probe, tmp_path):
    node = {"processes": 2, "bandwidth_bps": 4e9, "latency_s": 3e-5}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(dict(probe, node=node)))
    common = [PY, "-m", "tools.predict", "--from", str(path), "--nodes", "4", "--gpus-per-node", "2"]
    got = assert_ok(run([*common, "--hierarchical"])).stdout
    assert "ring of 4 nodes, hierarchical (4 Gbit/s inside)" in got, got
    assert "hierarchical (10 Gbit/s inside)" in assert_ok(run([*common, "--hierarchical-gbps", "10"])).stdout
    point, params, _, _ = predict.job_point(dict(probe, node=node), 4, 2, intra=(4e9, 3e-5))
    flat, _, _, _ = predict.job_point(probe, 4, 2)
    assert point["nodes"] == 4 and point["intra_latency_s"] == 3e-5
    assert scaling_model.step_s(point, params) != scaling_model.step_s(flat, params)
    path.write_text(json.dumps(probe))  # a probe of one process a host: no node's ring
    r = run([*common, "--hierarchical"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--hierarchical needs a probe run with 2 or more processes on each of 2 or more hosts" in r.stderr


def test_the_spread_fit_recovers_a_known_stretch():
    rings = [(n, 1e9 / (1 + 0.04 * math.log2(n / 2))) for n in (2, 4, 8, 16)]
    assert allreduce.fit_spread(rings) == pytest.approx(0.04)
    assert allreduce.fit_spread(rings[1:]) == pytest.approx(0.04)  # from 4 up
    assert allreduce.fit_spread(rings[:1]) is None
    assert allreduce.ring_units(["a", "a", "b", "b"]) == [[0, 1], [2, 3]]
    assert allreduce.ring_units(["a"] * 3) == [[0], [1], [2]]


def test_without_a_probe_the_emulators_constants_stand_in_and_say_so():
    p = assert_ok(run([PY, "-m", "tools.predict", "--nodes", "4", "--gpus-per-node", "8", "--link-gbps", "100",
                       "--step-ms", "6.39", "--arch", "lenet", "--batch", "8"]))
    assert "note: no probe: the link's efficiency, latency and spread are the scaling model's fit" in p.stdout
    assert "not measured (no probe)" in p.stdout


@pytest.mark.parametrize("argv, needle", [
    (["--from", "/nonexistent/probe.json", "--nodes", "2"], "cannot read the probe /nonexistent/probe.json"),
    (["--nodes", "2"], "without --from PROBE.json, give --link-gbps and --step-ms"),
    (["--nodes", "0", "--link-gbps", "1", "--step-ms", "1"], "must be positive"),
    (["--nodes", "2", "--hierarchical-gbps", "9", "--algorithm", "tree"], "give it or --algorithm tree, not both"),
])
def test_bad_input_is_one_line(argv, needle, capsys):
    # In process; the next test runs the command, for its exit status and stderr.
    with pytest.raises(SystemExit) as e:
        predict.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_a_probe_file_of_another_shape_is_one_line(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"n": 2, "bandwidth_bps": 1e9}))
    r = run([PY, "-m", "tools.predict", "--from", str(old), "--nodes", "2"])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "lacks hosts, device, latency_s, tensor_bytes, profile, step_times_s" in r.stderr


def test_a_probe_without_a_bandwidth_needs_the_link_given(probe, tmp_path, capsys):
    # The probe's largest message was too small to show the link: it wrote no bandwidth, and a
    # reason. tools.predict refuses in one line, or takes the link from --link-gbps.
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(dict(probe, bandwidth_bps=None, spread=None,
                                    bandwidth_reason="the largest message is too small")))
    with pytest.raises(SystemExit) as e:
        predict.main(["--from", str(path), "--nodes", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds no bandwidth (the largest message is too small); give the link with --link-gbps" in err
    assert predict.main(["--from", str(path), "--nodes", "2", "--link-gbps", "0.1"]) == 0
    assert "ring of 2, 0.1 Gbit/s" in capsys.readouterr().out
