"""The Prefect files in infra/ as Prefect reads them: every deployment's entrypoint is a flow that takes its
parameters, and the alert automation is a valid automation."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_each_deployment_names_a_flow_that_takes_its_parameters(deployment: dict) -> None:
    from prefect import Flow

    module, name = deployment["entrypoint"].split(":")
    flow = getattr(importlib.import_module(module.removesuffix(".py").replace("/", ".")), name)
    assert isinstance(flow, Flow)
    accepted = inspect.signature(flow.fn).parameters
    assert set(deployment["parameters"]) <= set(accepted), deployment["name"]
    assert deployment["work_pool"]["name"] == "cic-process"


def test_the_recalibration_alert_automation_is_valid_and_watches_the_recalibration_flow() -> None:
    from prefect.events.schemas.automations import AutomationCore

    from flows.recalibrate import recalibrate_flow

    automation = AutomationCore.model_validate(yaml.safe_load((ROOT / "infra" / "prefect-automations.yaml")
                                                              .read_text()))
    assert automation.trigger.expect == {"prefect.flow-run.Failed"}
    assert automation.trigger.match_related.root["prefect.resource.name"] == recalibrate_flow.name
    assert automation.actions[0].type == "send-notification"
