"""Every check of ``python -m verify``: stable ids, and metadata declared once per check."""
from __future__ import annotations

from results.check import COMPARES, KINDS, UNITS
from verify.checks import all_checks

#: The ids before issue 8 (python -m verify --list at 519625b), in order.
OLD_IDS = """
equivalence/softmax equivalence/linear equivalence/causal equivalence/packing equivalence/padding
equivalence/tree-exp equivalence/tree-dc equivalence/tree-diam equivalence/toeplitz-1d
equivalence/block-toeplitz equivalence/low-rank equivalence/hypercube-gdk
performer/prf-unbiased-iid performer/prf-unbiased-orf performer/prf-variance-iid performer/prf-variance-orf
choromanski22/lemma-3.3 choromanski22/section-4.1 choromanski22/section-4.1-grid choromanski22/section-3.4
choromanski22/lemma-3.5 choromanski22/lemma-6.1 choromanski22/lemma-6.2 choromanski22/lemma-6.2-diam
complexity/softmax complexity/linear complexity/causal complexity/packing complexity/padding
complexity/tree-exp complexity/tree-dc complexity/tree-diam complexity/toeplitz-1d complexity/block-toeplitz
complexity/low-rank complexity/hypercube-gdk
scale/linear scale/causal scale/block-toeplitz scale/tree-exp
""".split()
#: Added by issue 8 (training scale) and issue 9 (feature maps, guards, reproducibility).
NEW_IDS = ["scale/linear-train", "scale/causal-train", "scale/block-toeplitz-train",
           "features/trig-rff-unbiased", "features/trig-rff-variance",
           "features/hyperbolic-unbiased", "features/hyperbolic-variance", "reproducibility/samplers"]


def _issue_9_ids() -> list[str]:
    """guard/<id> for every linear mechanism, reproducibility/<id> for every random one."""
    from verify.mechanisms import mechanisms

    return ([f"guard/{m.id}" for m in mechanisms() if m.linear]
            + [f"reproducibility/{m.id}" for m in mechanisms() if m.draw is not None])


def _issue_10_ids() -> list[str]:
    """numerics/<id> for every registered mechanism."""
    from verify.mechanisms import mechanisms

    return [f"numerics/{m.id}" for m in mechanisms()]


def _issue_11_ids() -> list[str]:
    """perf/<id> for every registered mechanism."""
    from verify.mechanisms import mechanisms

    return [f"perf/{m.id}" for m in mechanisms()]


#: The graph-kernel claims (issue 12): choromanski22 Sec. 4 and reid25.
ISSUE_12_PAPER_IDS = ["choromanski22/theorem-4.1", "choromanski22/markov", "choromanski22/theorem-4.2",
                      "reid25/unbiased", "reid25/theorem-3.1", "reid25/lemma-3.2", "reid25/rate",
                      "reid25/diagonal-bias", "reid25/algorithm-2", "reid25/variance-reduction"]
#: The mechanisms issue 12 registered: each gets equivalence/ and complexity/ like the older ones.
ISSUE_12_MECHANISMS = ("gdk", "rwgnk", "power-series", "grf", "grf-asym")


def _family_ids(paper_ids: list[str], mech_ids: tuple[str, ...]) -> list[str]:
    """A family's paper checks, equivalence/ and complexity/ of its mechanisms, and their scale/ checks."""
    from verify.mechanisms import mechanisms

    registered = {m.id for m in mechanisms()}
    generic = [f"{family}/{m}" for m in mech_ids if m in registered for family in ("equivalence", "complexity")]
    scale = [f"scale/{m.id}{suffix}" for m in mechanisms() if m.id in mech_ids
             for suffix, on in (("", m.scale), ("-train", m.scale_train)) if on]
    return paper_ids + generic + scale


def _issue_12_ids() -> list[str]:
    """The paper checks, equivalence/ and complexity/ of the graph mechanisms, scale/grf(-train)."""
    return _family_ids(ISSUE_12_PAPER_IDS, ISSUE_12_MECHANISMS)


#: The latent-graph claims (issue 13): wu22.
ISSUE_13_PAPER_IDS = ["wu22/lemma-1", "wu22/theorem-1", "wu22/lemma-2", "wu22/lemma-3", "wu22/theorem-2",
                      "wu22/large-tau", "wu22/gumbel-unbiased"]
#: The mechanisms issue 13 registers: equivalence/ and complexity/ each, scale/ where flagged.
ISSUE_13_MECHANISMS = ("nodeformer", "nodeformer-gumbel", "relational-bias", "edge-loss", "difformer", "sgformer")


def _issue_13_ids() -> list[str]:
    """The wu22 checks, equivalence/ and complexity/ of the latent-graph mechanisms, their scale/ checks."""
    return _family_ids(ISSUE_13_PAPER_IDS, ISSUE_13_MECHANISMS)


#: The checks issue 24 adds (verify's blind spots on the graph families): the layers against a reference
#: computation, the laws of the samplers fast/ calls on its own.
ISSUE_24_IDS = ["layers/nodeformer-conv", "layers/difformer", "layers/sgformer", "sampling/walks", "sampling/gumbel",
                "numerics/value-overflow", "sampling/projection"]


#: The sharded-attention checks (issue 26): one per case of verify.sharding.
ISSUE_26_IDS = ["distributed/linear", "distributed/linear-causal", "distributed/packing", "distributed/padding",
                "distributed/favor", "distributed/favor-causal", "distributed/kernelized-softmax", "distributed/gumbel",
                "distributed/sgformer", "distributed/difformer"]


def test_ids_are_the_old_ones_plus_the_new_families():
    ids = [c.id for c in all_checks()]
    assert len(ids) == len(set(ids))
    assert set(ids) == (set(OLD_IDS) | set(NEW_IDS) | set(_issue_9_ids()) | set(_issue_10_ids()) | set(_issue_11_ids())
                        | set(_issue_12_ids()) | set(_issue_13_ids()) | set(ISSUE_24_IDS) | set(ISSUE_26_IDS))
    assert len(_issue_9_ids()) >= 2 * 11  # every masked mechanism is linear and random
    # the old ids keep their order (the scale family was regrouped by issue 8)
    old = set(OLD_IDS)
    assert [i for i in ids if i in old and not i.startswith("scale/")] == [i for i in OLD_IDS if not i.startswith("scale/")]


def test_every_check_declares_how_it_is_judged():
    for c in all_checks():
        assert c.kind in KINDS and c.title and c.source, c.id
        assert c.compare in COMPARES and c.compare, c.id  # every check today is one main comparison
        # perf/<id>'s threshold (the validity ceiling) follows the run's round-to-round spread
        assert (c.threshold is None) == (c.kind == "perf"), c.id
        assert c.unit in UNITS and c.unit, c.id
    units = {c.id.split("/")[0]: c.unit for c in all_checks()}
    assert units["scale"] == "ratio" and units["complexity"] == "exponent" and units["equivalence"] == "ratio"
    assert units["perf"] == "ratio"
