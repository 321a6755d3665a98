"""A serving deployment: which target (and the alias it follows) is served where, and how."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ServingDeployment(BaseModel):
    """One endpoint serving a target with its validated drafter (or with speculation off)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    target_name: str
    target_alias: str = "production"  # the deployment follows this alias of the target
    task_mix: dict[str, float] = Field(default_factory=lambda: {"code": 0.5, "math": 0.5})
    temperature: float = Field(0.0, ge=0.0)
    launch: Literal["reference", "vllm"] = "reference"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)  # 0: pick a free port at launch
    tensor_parallel_size: int = Field(1, ge=1)
