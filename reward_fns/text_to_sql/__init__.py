"""Text-to-SQL verifier: format, executability and execution-match rewards.

The reward dispatcher routes samples whose data_source is (or starts with) one
of `DATA_SOURCES` to `compute_score`. The pieces:

* `parse`: the expected response format and the extraction of the query;
* `limits`: size, encoding and nesting caps checked before any parser runs;
* `sandbox`: read-only, time- and size-limited execution on SQLite;
* `sql_tasks`, `isolation`: the tasks run in ``reward_fns.process_pool``'s worker processes
  (memory and file-size limits, a deadline enforced by killing) that run
  parsing and execution;
* `compare`: Spider (bag, ORDER BY-aware) and BIRD (set) result equality;
* `ground_truth`: the ground-truth schema and how database files are found;
* `verifier`: `compute_score`, which ties them together.
"""

from reward_fns.text_to_sql.ground_truth import BUNDLED_DB_ROOT
from reward_fns.text_to_sql.parse import EXPECTED_FORMAT
from reward_fns.text_to_sql.verifier import REWARD_KEYS, compute_score

DATA_SOURCES: tuple[str, ...] = ("spider", "bird", "text2sql")

__all__ = ["BUNDLED_DB_ROOT", "DATA_SOURCES", "EXPECTED_FORMAT", "REWARD_KEYS", "compute_score"]
