"""MLflow tracking of training runs: a logger that never stops training (`store`), episodes as chat traces with
reward assessments (`chat`), run tags, figures and the final model (`review`, `figures`); a new sqlite store is
copied from an empty one MLflow migrated once (`store_template`).

``agentrl fit`` uses `MLflowLogger` and `TrajectoryLogger` by default; docs/review.md shows what a run looks like
in the MLflow UI, docs/operations.md ("Tracking faults") what happens when the store fails.
"""

from agentrl.tracking.review import TrajectoryLogger, log_config, transcript
from agentrl.tracking.store import DEFAULT_TRACKING_URI, MLflowLogger, reopen_run

__all__ = ["DEFAULT_TRACKING_URI", "MLflowLogger", "TrajectoryLogger", "log_config", "reopen_run", "transcript"]
