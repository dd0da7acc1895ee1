"""The queue's vocabulary: task names, queue names, and a step's job."""

from __future__ import annotations

from safeaccess.server.config import ServerConfig
from safeaccess.server.store.queue import QueuedJob

TABLE_TASK = "safeaccess.run_step"
SCRIPT_TASK = "safeaccess.run_script"
#: Interactive steps (any kind but scripts): the researcher waits for them.
STEPS = "steps"
#: Scripts: run in the background, with their own slots, so they never delay a table.
SCRIPTS = "scripts"


def steps_queue(config: ServerConfig, dataset: str) -> str:
    """The queue of a dataset's interactive steps: its pool's, else 'steps'."""
    pool = config.queue.pools.get(dataset)
    return f"{STEPS}.{pool}" if pool else STEPS


def step_job(
    config: ServerConfig,
    *,
    sequence_id: str,
    index: int,
    researcher: str,
    dataset: str,
    script: bool,
) -> QueuedJob:
    """The job that computes step `index` of a sequence."""
    return QueuedJob(
        task=SCRIPT_TASK if script else TABLE_TASK,
        queue=SCRIPTS if script else steps_queue(config, dataset),
        sequence_id=sequence_id,
        index=index,
        researcher=researcher,
        dataset=dataset,
        lanes=config.max_jobs_per_researcher,
    )
