"""TensorBoard's first screen: no `final` group of lone points at step 0; the final metrics in HPARAMS."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from minigpt.runs.train import train
from minigpt.training.reporting import FINAL_METRICS


def _hparams_data(tb: Path) -> list[tuple[int, HParamsPluginData]]:
    """(step, parsed plugin data) of every hparams summary in the run's event files."""
    found = []
    for events in sorted(tb.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(events)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    found.append((event.step, data))
    return found


@pytest.mark.slow
def test_final_metrics_are_the_runs_own_series_in_hparams_not_lone_points(make_train_cfg, tmp_path: Path):
    out = tmp_path / "run"
    result = train(make_train_cfg("trainer.max_steps=6", "optim.lr=1e-2", "optim.schedule=wsd"), out)
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    assert not [t for t in tags if t.startswith("final")]
    for tag in tags:  # every series runs over the training steps; none is a lone point at step 0
        assert max(e.step for e in events.Scalars(tag)) == result.step, tag
    for tag in FINAL_METRICS:  # what HPARAMS shows: the last point of each, at the last step
        assert tag in tags, tag
    assert events.Scalars("val/loss")[-1].value == pytest.approx(result.val_loss)
    assert events.Scalars("val/best_loss")[-1].value == pytest.approx(result.best_val_loss)

    data = _hparams_data(out / "tb")
    kinds = {d.WhichOneof("data"): (step, d) for step, d in data}
    assert set(kinds) == {"experiment", "session_start_info", "session_end_info"}
    assert {step for step, _ in data} == {result.step}
    metrics = [m.name.tag for m in kinds["experiment"][1].experiment.metric_infos]
    assert metrics == list(FINAL_METRICS)
    hparams = kinds["session_start_info"][1].session_start_info.hparams
    assert hparams["optim.lr"].number_value == pytest.approx(1e-2)
    assert hparams["optim.schedule"].string_value == "wsd"
    assert hparams["trainer.max_time"].string_value == "null"  # None, as JSON text
    # No extra sub-run folder: TensorBoard lists this run once.
    assert [p.name for p in (out / "tb").iterdir() if p.is_dir()] == []
