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


def test_the_recalibration_automations_route_pages_and_warnings_apart() -> None:
    from prefect.events.schemas.automations import AutomationCore

    from flows.recalibrate import WARNING_EVENT, recalibrate_flow

    page, warning = (AutomationCore.model_validate(a) for a in
                     yaml.safe_load((ROOT / "infra" / "prefect-automations.yaml").read_text())["automations"])
    assert page.trigger.expect == {"prefect.flow-run.Failed"}
    assert page.trigger.match_related.root["prefect.resource.name"] == recalibrate_flow.name
    assert warning.trigger.expect == {WARNING_EVENT}
    assert warning.trigger.match.root["prefect.resource.name"] == recalibrate_flow.name
    assert page.actions[0].type == warning.actions[0].type == "send-notification"
    assert page.actions[0].block_document_id != warning.actions[0].block_document_id  # two channels
