"""What a job leaves behind, by job type: the part of the master that differs between
train, evaluate, predict and export.

- train: with `--output`, the trained model as a SavedModel (`OUTPUT/saved_model`);
- evaluate: the metrics of its one evaluation round, printed and written to
  `OUTPUT/evaluation.json` (`{"checkpoints", "model_version", "ensemble_combiner",
  "metrics"}`);
- predict: every record's prediction, handed to the module's `PredictionOutputsProcessor` or
  written under `OUTPUT/predictions/` (see `predictions`);
- export: the restored model as the same SavedModel training writes, `OUTPUT/saved_model`.
"""

import json
import logging
import os

from elastic_keras.common import job_types
from elastic_keras.common.atomic_file import atomic_write
from elastic_keras.common.errors import ConfigError, ModelSpecError
from elastic_keras.master.predictions import PredictionSink

logger = logging.getLogger(__name__)


class JobOutputs:
    """The outputs of one job.

    Args:
        config: the job's `JobConfig`.
        spec: the checked `ModelSpec`.

    Raises:
        ModelSpecError: the module lacks what the job type needs (`eval_metrics_fn` to
            evaluate), or its `PredictionOutputsProcessor` cannot be made.
        ConfigError: a prediction job has nowhere to put predictions (no processor, no
            `--output`).
    """

    def __init__(self, config, spec):
        self.config = config
        self.spec = spec
        self.job_type = config.job_type
        self.members = []     # the checkpoints the job's models come from
        self.sink = None      # a prediction job's `PredictionSink`
        self._processor = None
        self._error = ""
        if self.job_type == job_types.EVALUATE and spec.eval_metrics_fn is None:
            raise ModelSpecError(f"Model module '{spec.module_name}' defines no "
                                 "eval_metrics_fn(): elastic-keras evaluate needs it.")
        if self.job_type == job_types.PREDICT:
            self._processor = _make_processor(spec)
            if self._processor is None and not config.output:
                raise ConfigError(
                    "elastic-keras predict needs --output (predictions are written under "
                    f"it) when the module defines no PredictionOutputsProcessor. Received: "
                    f"module '{spec.module_name}' without one, and no --output")

    @property
    def trains(self):
        return self.job_type == job_types.TRAIN

    @property
    def runs_workers(self):
        return self.job_type != job_types.EXPORT

    def start(self, start, reports):
        """Takes the job's `Start`; a prediction job's sink goes to `reports`."""
        self.members = list(start.members)
        if self.job_type == job_types.PREDICT:
            self.sink = PredictionSink(start.data_files, self.config.minibatch_size,
                                       self._processor, self.config.output)
            reports.predictions = self.sink
            logger.info("Predictions go to %s", self.sink.where)

    def round_closed(self, finished_round, evaluations):
        """An evaluation round (a prediction job's: its prediction round) has ended."""
        if self.job_type == job_types.PREDICT:
            return
        result = evaluations.close(finished_round)
        if self.job_type == job_types.EVALUATE and not result["metrics"]:
            self._error = ("the evaluation produced no metrics: eval_metrics_fn() returned "
                           "none, or their merged states could not be computed (see the log)")

    @property
    def error(self):
        """Why the job must fail for its outputs (a processor that raised, an evaluation
        without metrics), or ""."""
        return self._error or (self.sink.error if self.sink else "")

    def close(self):
        """At the end of any job: lets a prediction sink's thread finish."""
        if self.sink is not None:
            self.sink.close()

    def finish(self, ps_client, evaluations, sample_file):
        """After a good end: writes what the job leaves (see the module); returns why the
        job fails after all (a processor that raised, an evaluation without metrics), or
        "", writing nothing then."""
        if self._error:
            return self._error
        output = self.config.output
        if self.sink is not None:
            if self.sink.close():
                return self.sink.error
            logger.info("Predicted %d records; they went to %s", self.sink.records,
                        self.sink.where)
        if self.job_type in (job_types.TRAIN, job_types.EXPORT) and output:
            from elastic_keras.master.export import export_saved_model, sample_features

            features = sample_features(self.spec, sample_file, self.config.index_cache_dir)
            export_saved_model(self.spec, ps_client, features,
                               os.path.join(output, "saved_model"),
                               self.config.embedding_threshold_params)
        elif self.job_type == job_types.EVALUATE and evaluations.results and output:
            last = evaluations.results[-1]
            os.makedirs(output, exist_ok=True)
            with atomic_write(os.path.join(output, "evaluation.json"), "w") as stream:
                json.dump(self.evaluation(evaluations), stream, indent=2)
                stream.write("\n")
            logger.info("Wrote the metrics of model version %d to %s", last["model_version"],
                        os.path.join(output, "evaluation.json"))
        return ""

    def evaluation(self, evaluations):
        """What evaluation.json holds."""
        last = evaluations.results[-1]
        return {"checkpoints": self.members, "model_version": last["model_version"],
                "ensemble_combiner": (self.config.ensemble_combiner
                                      if len(self.members) > 1 else ""),
                "metrics": last["metrics"]}

    def summary(self, reports):
        """The summary's `outputs` entry."""
        if self.trains:
            return {}
        facts = {"checkpoints": self.members, "records": reports.inferred}
        if self.sink is not None:
            facts["predictions"] = self.sink.where
        return facts


def _make_processor(spec):
    if spec.prediction_outputs_processor is None:
        return None
    try:
        return spec.prediction_outputs_processor()
    except Exception as exc:  # noqa: BLE001 - the user's class: named in the error
        raise ModelSpecError(
            f"Model module '{spec.module_name}': PredictionOutputsProcessor() raised "
            f"{type(exc).__name__}: {exc}") from exc
