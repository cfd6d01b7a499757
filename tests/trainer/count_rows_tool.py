"""A real tool for verl's tool agent loop: the number of rows of a table of a bundled Spider database.

A ``verl.tools.base_tool.BaseTool`` subclass, declared in a tool config file the way verl loads native tools
(``actor_rollout_ref.rollout.multi_turn.tool_config_path``, :func:`tool_config`). It queries the real SQLite
database read-only and answers in JSON: ``{"table": ..., "rows": n}``, or an error naming the tables there are.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from reward_fns.text_to_sql import BUNDLED_DB_ROOT

TOOL_NAME = "count_rows"


class CountRowsTool(BaseTool):
    """``count_rows(table)`` on the Spider database named by the tool config's ``db_id``."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.database = Path(BUNDLED_DB_ROOT) / f"{config['db_id']}.sqlite"
        if not self.database.is_file():
            raise FileNotFoundError(f"count_rows tool: no database {self.database} (config db_id={config['db_id']!r})")

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        table = str(parameters.get("table", ""))
        with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True) as connection:
            tables = sorted(row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'"))
            if table not in tables:
                return ToolResponse(text=json.dumps({"error": f"no such table: {table}", "tables": tables})), 0.0, {}
            (rows,) = connection.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()
        return ToolResponse(text=json.dumps({"table": table, "rows": rows})), 0.0, {}


def tool_config(path: Path, db_id: str = "concert_singer") -> Path:
    """Write the tool config file verl's ``initialize_tools_from_config`` reads (one native tool); returns ``path``."""
    schema = {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Count the rows of a table of the database.",
            "parameters": {
                "type": "object",
                "properties": {"table": {"type": "string", "description": "the table's name"}},
                "required": ["table"],
            },
        },
    }
    entry = {
        "class_name": f"{__name__}.CountRowsTool",
        "config": {"type": "native", "db_id": db_id},
        "tool_schema": schema,
    }
    path.write_text(json.dumps({"tools": [entry]}, indent=2))  # JSON is YAML: OmegaConf.load reads it
    return path
