"""fit_efficiency.fit searches the COUPLED knob pairs jointly: a valley that no one-knob move can
enter (every single-coordinate step from the start raises the loss) is reached in one joint step."""

from __future__ import annotations

import fit_efficiency as fe


def test_joint_move_reaches_a_valley_one_knob_moves_cannot(monkeypatch):
    start = fe.START.model_copy(update={"attention": 0.20, "attention_half_seq": 4096.0})

    def loss(gpu, eff, runs):
        pair = (eff.attention, eff.attention_half_seq)
        return {(0.25, 2048): 0.0, (0.20, 4096.0): 1.0}.get(pair, 2.0)

    monkeypatch.setattr(fe, "loss", loss)
    got = fe.fit("GB200-186GB", [], start=start)
    assert (got.attention, got.attention_half_seq) == (0.25, 2048)
    # the pairs are knobs of the grid, and no pair names a knob twice
    assert all(a in fe.GRID and b in fe.GRID and a != b for a, b in fe.COUPLED)


def test_without_the_joint_step_coordinate_descent_stays(monkeypatch):
    start = fe.START.model_copy(update={"attention": 0.20, "attention_half_seq": 4096.0})
    monkeypatch.setattr(fe, "loss", lambda gpu, eff, runs: {(0.25, 2048): 0.0, (0.20, 4096.0): 1.0}.get(
        (eff.attention, eff.attention_half_seq), 2.0))
    monkeypatch.setattr(fe, "COUPLED", ())
    got = fe.fit("GB200-186GB", [], start=start)
    assert (got.attention, got.attention_half_seq) == (0.20, 4096.0)
