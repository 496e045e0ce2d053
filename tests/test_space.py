import math

import numpy as np
import pytest

from adaptune.search.knobs import LOCATION, TILE, perfect_tilings, sampled_decisions
from adaptune.search.space import KnobSpace
from adaptune.model.workloads import get_workload


def _closed_form(extent, n):
    count, x, p = 1, extent, 2
    while x > 1:
        e = 0
        while x % p == 0:
            x //= p
            e += 1
        count *= math.comb(e + n - 1, n - 1)
        p += 1
    return count


@pytest.mark.parametrize("extent,n", [(64, 4), (56, 4), (3, 2), (128, 4), (7, 4)])
def test_perfect_tilings_match_closed_form(extent, n):
    tiles = perfect_tilings(extent, n, 0)
    assert len(tiles) == len(set(tiles)) == _closed_form(extent, n)
    assert all(math.prod(t) == extent for t in tiles)
    assert all(t[-1] <= 16 for t in perfect_tilings(extent, n, 16))


def test_knobs_cover_every_sampling_instruction(conv_space):
    sp = conv_space
    assert sp.knobs[0].size == len(sp.traces) >= 2
    for s, trace in enumerate(sp.traces):
        n_sample = sum(1 for i in trace.insts if i.kind.name.startswith("Sample"))
        assert len(sp._space_insts[s]) == n_sample
    tiles = [k for k in sp.knobs if k.kind == TILE]
    assert {k.extent for k in tiles} == {1, 16, 14, 3}
    for k in tiles:
        assert all(math.prod(v) == k.extent for v in k.values)
    assert any(k.kind == LOCATION for k in sp.knobs)


def test_random_configs_decode_and_encode_back(conv_space):
    rng = np.random.default_rng(0)
    configs = conv_space.random(30, rng)
    assert (configs >= 0).all() and (configs < conv_space.sizes).all()
    for c in configs:
        sch, reason, canon = conv_space.decode(c)
        assert sch is not None, reason
        assert (conv_space.encode(sch.trace) == canon).all()
        # MetaSchedule's own search stores traces simplified (dead instructions dropped, variables
        # renumbered): its records encode to the same config
        assert (conv_space.encode(sch.trace.simplified(remove_postproc=True)) == canon).all()
        # the schedule really carries the decisions of the config
        tiles = [d for kind, d in sampled_decisions(sch.trace) if kind == "SamplePerfectTile"]
        want = [conv_space.knobs[k].values[canon[k]] for _, k in conv_space._space_insts[canon[0]]
                if conv_space.knobs[k].kind == TILE]
        assert tiles == want


def test_simplified_traces_differ_so_their_encoding_is_tested(conv_space):
    sch = conv_space.decode(conv_space.random(1, np.random.default_rng(0))[0])[0]
    raw = sch.trace.as_json(remove_postproc=True)[0]
    assert sch.trace.simplified(remove_postproc=True).as_json(remove_postproc=True)[0] != raw


def test_repaired_decision_is_reported_invalid(target):
    sp = KnobSpace(get_workload("tiny-dense").mod(), target, seed=3)
    k = next(i for i, kn in enumerate(sp.knobs) if kn.kind == TILE and kn.extent == 64)
    sp.knobs[k].values.append((3, 1, 1, 21))        # product 63: TVM silently repairs it
    config = np.zeros(sp.ndim, dtype=np.int64)
    config[k] = len(sp.knobs[k].values) - 1
    sp.sizes[k] += 1
    sch, reason, _ = sp.decode(config)
    assert sch is None and "repaired" in reason
    config[k] = 0
    assert sp.decode(config)[0] is not None


def test_tune_state_resolves_configs_to_the_key_tvm_measures(target, conv_space):
    """A rejected config resolves to None and is remembered as invalid; a location TVM moves
    resolves to the location it settled on (the key its measurement is recorded under)."""
    from adaptune.search.state import TuneState
    sp = KnobSpace(get_workload("tiny-dense").mod(), target, seed=3)
    k = next(i for i, kn in enumerate(sp.knobs) if kn.kind == TILE and kn.extent == 64)
    sp.knobs[k].values.append((3, 1, 1, 21))        # product 63: TVM repairs it
    sp.sizes[k] += 1
    bad, good = np.zeros((2, sp.ndim), dtype=np.int64)
    bad[k] = sp.sizes[k] - 1
    state = TuneState(sp)
    assert state.resolve(np.stack([bad, good])) == [None, tuple(int(x) for x in sp.decode(good)[2])]
    assert tuple(int(x) for x in sp.canonical(bad)[0]) in state.invalid
    loc = next(i for i, kn in enumerate(conv_space.knobs) if kn.kind == LOCATION)
    configs = conv_space.random(20, np.random.default_rng(5))
    configs[:, loc] = conv_space.sizes[loc] - 1
    state = TuneState(conv_space)
    keys = state.resolve(configs)
    assert all(key is not None and key[loc] <= c[loc] for key, c in zip(keys, configs))
    moved = [(tuple(int(x) for x in c), key) for c, key in zip(configs, keys) if key[loc] < c[loc]]
    assert moved
    # a config that replays as a measured key counts as measured: strategies never pick it again
    raw, key = moved[0]
    assert raw not in state.measured_keys() and len(state.unmeasured(np.array([raw]))) == 1
    state.record([np.array(key)], [1e-3])
    assert raw in state.measured_keys() and len(state.unmeasured(np.array([raw]))) == 0


def test_configs_that_give_one_kernel_share_one_key(conv_space):
    """Tilings that differ only in where a unit-extent loop sits often give the same loop nest once
    TVM simplifies it: such configs resolve to one key, and once one is measured the others count
    as measured (never timed again)."""
    from adaptune.search.state import TuneState
    state = TuneState(conv_space)
    tiles = [i for i, kn in enumerate(conv_space.knobs) if kn.kind == TILE and kn.size > 1]
    shared = 0
    for c in conv_space.random(6, np.random.default_rng(7)):
        for k in tiles[:3]:
            configs = np.repeat(c[None], conv_space.sizes[k], 0)
            configs[:, k] = np.arange(conv_space.sizes[k])
            keys = state.resolve(configs)
            scripts = [conv_space.decode(x)[0].mod.script() if key else None for x, key in zip(configs, keys)]
            assert all((a == b) == (sa == sb) for a, sa in zip(keys, scripts) for b, sb in zip(keys, scripts))
            dup = next((key for key in keys if key is not None and keys.count(key) > 1), None)
            if dup is None:
                continue
            shared += 1
            state.record([np.array(dup)], [1e-3])
            taken = state.measured_keys()
            assert all((tuple(int(x) for x in cfg) in taken) == (key == dup or key is None)
                       for cfg, key in zip(conv_space.canonical(configs), keys))
    assert shared          # the case arises on this workload


def test_location_knob_holds_tvms_decision_and_settles_on_a_valid_one(conv_space):
    k = next(i for i, kn in enumerate(conv_space.knobs) if kn.kind == LOCATION)
    assert conv_space.knobs[k].values[:2] == [-2, -1]           # inline, root, then loop positions
    rng = np.random.default_rng(5)
    settled = 0
    for c in conv_space.random(20, rng):
        c[k] = conv_space.sizes[k] - 1                           # the innermost position
        sch, _, canon = conv_space.decode(c)
        assert sch is not None and canon[k] <= c[k]
        settled += canon[k] < c[k]
        got = [d for kind, d in sampled_decisions(sch.trace) if kind == "SampleComputeLocation"]
        assert conv_space.knobs[k].values[canon[k]] in got
        assert (conv_space.encode(sch.trace) == canon).all()
        assert str(conv_space.decode(canon)[0].mod) == str(sch.mod)
    assert settled > 0          # the innermost loop is not always a valid location


def test_deterministic_under_seed(target):
    a = KnobSpace(get_workload("tiny-dense").mod(), target, seed=7)
    b = KnobSpace(get_workload("tiny-dense").mod(), target, seed=7)
    assert (a.sizes == b.sizes).all()
    ca, cb = a.random(50, np.random.default_rng(7)), b.random(50, np.random.default_rng(7))
    assert (ca == cb).all()
    assert str(a.decode(ca[0])[0].mod) == str(b.decode(cb[0])[0].mod)


def test_features_and_normalisation(conv_space):
    configs = conv_space.random(1000, np.random.default_rng(1))
    x = conv_space.features(configs)
    assert x.shape[0] == 1000 and np.isfinite(x).all() and x.min() >= 0 and x.max() <= 1
    norm = conv_space.normalized(configs)
    assert norm.shape == configs.shape and norm.min() >= 0 and norm.max() <= 1
    # inactive knobs are zeroed so equal schedules compare equal
    canon = conv_space.canonical(configs)
    assert (canon[~conv_space.active[canon[:, 0]]] == 0).all()


def test_prior_samples_are_valid_configs_from_tvms_sampler(conv_space):
    a = conv_space.sample_prior(12, np.random.default_rng(3))
    b = conv_space.sample_prior(12, np.random.default_rng(3))
    assert len(a) == 12 and (a == b).all()                      # seeded
    assert (a >= 0).all() and (a < conv_space.sizes).all()
    assert (conv_space.canonical(a) == a).all()
    for c in a:
        assert conv_space.decode(c)[0] is not None
    # TVM's tile sampler favours balanced tilings: the mean largest factor of the biggest tile knob
    # is below the uniform draw's
    k = int(np.argmax([kn.size if kn.kind == TILE else 0 for kn in conv_space.knobs]))
    prior = conv_space.sample_prior(40, np.random.default_rng(0))
    uniform = conv_space.random(400, np.random.default_rng(0))
    biggest = [max(conv_space.knobs[k].values[row[k]]) for row in prior if conv_space.active[row[0], k]]
    assert np.mean(biggest) < np.mean([max(conv_space.knobs[k].values[i]) for i in uniform[:, k]])


def test_threaded_decode_gives_what_one_thread_gives(target):
    """decode_many decodes on two threads; each row must come back as a one-thread decode gives
    it (same validity, reason, canonical config and schedule), in the rows' order."""
    import tvm

    mod = get_workload("tiny-conv").mod()
    threaded, serial = KnobSpace(mod, target, seed=1), KnobSpace(mod, target, seed=1)
    threaded.decode_threads, serial.decode_threads = 2, 1
    rng = np.random.default_rng(3)
    configs = threaded.random(24, rng)
    configs = np.concatenate([configs, configs[:3]])       # repeats decode once, come back in place
    got = threaded.decode_many(configs)
    assert threaded._pool is not None                     # the threaded path really ran
    assert len(got) == len(configs)
    for c, (sch, reason, canon) in zip(configs, got):
        sch1, reason1, canon1 = serial.decode(c)
        assert reason == reason1 and (canon == canon1).all()
        assert (sch is None) == (sch1 is None)
        if sch is not None:
            tvm.ir.assert_structural_equal(sch.mod, sch1.mod)
