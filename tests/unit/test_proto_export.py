"""The exported contract files (``proto/schemas``, ``proto/openapi``) equal what the code generates."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import corl.proto
from corl.cli import app
from corl.cli.proto import drift, exported_files


def test_exported_files_do_not_drift() -> None:
    assert drift() == [], "proto/ is stale: run `corl proto export` and commit the result"


def test_every_wire_model_has_a_schema() -> None:
    files = exported_files()
    for name in ("GenerateRequest", "GradeRequest", "GradeResponse", "WeightUpdateRequest", "ErrorResponse"):
        assert name in corl.proto.__all__
        schema = json.loads(files[f"schemas/{name}.json"])
        assert schema["additionalProperties"] is False  # unknown fields are rejected on the wire


def test_openapi_documents_grade_with_its_error_shape() -> None:
    doc = json.loads(exported_files()["openapi/model_server.json"])
    grade = doc["paths"]["/v1/grade"]["post"]
    assert grade["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/GradeRequest")
    assert grade["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/GradeResponse")
    assert grade["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert {"/v1/generate", "/v1/weights", "/v1/info", "/healthz", "/readyz", "/metrics"} <= set(doc["paths"])


def test_openapi_documents_the_openai_routes() -> None:
    doc = json.loads(exported_files()["openapi/model_server.json"])
    for path, request, response in [
        ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletion"),
        ("/v1/completions", "CompletionRequest", "TextCompletion"),
    ]:
        post = doc["paths"][path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{request}")
        ok = post["responses"]["200"]
        assert ok["content"]["application/json"]["schema"]["$ref"].endswith(f"/{response}")
        assert "text/event-stream" in ok["content"] and "X-Corl-Weight-Version" in ok["headers"]
        assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    models = doc["paths"]["/v1/models"]["get"]["responses"]["200"]
    assert models["content"]["application/json"]["schema"]["$ref"].endswith("/ModelList")


def test_aggregator_openapi_documents_the_grading_pool() -> None:
    doc = json.loads(exported_files()["openapi/aggregator.json"])
    pull = doc["paths"]["/v1/grading/tasks"]["get"]
    assert {p["name"] for p in pull["parameters"]} >= {"max", "wait"}
    assert pull["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/GradingTasks")
    post = doc["paths"]["/v1/grading/results"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/GradingResults")
    register = doc["paths"]["/v1/graders"]["post"]
    assert register["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/GraderRegistration")


def test_aggregator_openapi_documents_the_reward_server_and_dashboard() -> None:
    doc = json.loads(exported_files()["openapi/aggregator.json"])
    for path, request, response in (
        ("/get_reward", "OpenRLHFRewardRequest", "OpenRLHFRewardResponse"),
        ("/v1/reward", "SlimeRewardRequest", "SlimeRewardResponse"),
    ):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{request}")
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{response}")
        assert op["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    view = doc["paths"]["/v1/runs/{run}/dashboard"]["get"]["responses"]["200"]["content"]["application/json"]
    assert view["schema"]["$ref"].endswith("/DashboardView")
    assert "text/html" in doc["paths"]["/dashboard"]["get"]["responses"]["200"]["content"]


def test_export_check_detects_drift(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["proto", "export", "--out", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["proto", "export", "--check", "--out", str(tmp_path)]).exit_code == 0
    (tmp_path / "schemas" / "GradeRequest.json").write_text("{}\n")
    (tmp_path / "schemas" / "Removed.json").write_text("{}\n")
    result = runner.invoke(app, ["proto", "export", "--check", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "schemas/GradeRequest.json" in result.output and "schemas/Removed.json" in result.output
