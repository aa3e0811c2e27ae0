"""A small client for the golden-file service (conformance/service.py; contract: /openapi.json)."""
from __future__ import annotations

from typing import Iterable, Optional
from urllib.parse import quote

import requests


class ServiceError(RuntimeError):
    """The service refused a request (4xx) or failed (5xx); the message carries its explanation."""

    def __init__(self, status: int, message: str, url: str):
        super().__init__(f"{url}: HTTP {status}: {message}")
        self.status = status
        self.message = message


class ServiceClient:
    def __init__(self, base_url: str, timeout: float = 30.0, session: Optional[requests.Session] = None,
                 token: Optional[str] = None):
        """`token`: sent as `Authorization: Bearer <token>` (default: $CHATGOLD_SERVICE_TOKEN), which a service
        reachable beyond its machine requires."""
        import os

        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()
        token = token or os.environ.get("CHATGOLD_SERVICE_TOKEN")
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def _url(self, *parts: str) -> str:
        return self.base_url + "/" + "/".join(quote(p, safe="") for p in parts)

    def _call(self, method: str, url: str, **kwargs) -> requests.Response:
        try:
            response = self.session.request(method, url, timeout=kwargs.pop("timeout", self.timeout), **kwargs)
        except requests.RequestException as exc:
            raise ServiceError(0, f"cannot reach the service: {exc}", url) from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ServiceError(response.status_code, detail if isinstance(detail, str) else str(detail), url)
        return response

    # -- read --------------------------------------------------------------------------------------------
    def templates(self, patterns: Optional[list[str]] = None, detail: bool = False) -> list[dict]:
        params = [("template", p) for p in patterns or []] + [("detail", str(detail).lower())]
        return self._call("GET", self._url("v1", "templates"), params=params).json()["templates"]

    def template(self, template_id: str) -> dict:
        return self._call("GET", self._url("v1", "templates", template_id)).json()

    def cases(self, patterns: Optional[list[str]] = None) -> list[dict]:
        params = [("case", p) for p in patterns or []]
        return self._call("GET", self._url("v1", "cases"), params=params).json()["cases"]

    def case(self, case_id: str) -> dict:
        return self._call("GET", self._url("v1", "cases", case_id)).json()

    def golden(self, template_id: str, case_id: str) -> tuple[str, bytes]:
        """(kind, exact bytes): kind is "rendered", or "raised" when the bytes are the reference's refusal."""
        response = self._call("GET", self._url("v1", "goldens", template_id, case_id))
        return response.headers["X-Chatgold-Outcome"], response.content

    # -- check -------------------------------------------------------------------------------------------
    def check(self, template_id: str, case_id: str, output: Optional[str] = None, raised: Optional[str] = None,
              attribute: bool = True, refusal: Optional[str] = None) -> dict:
        body = {"template": template_id, "case": case_id}
        body.update({"output": output} if raised is None else {"raised": raised})
        if raised is not None and refusal:
            body["refusal"] = refusal
        return self._call("POST", self._url("v1", "check"), json=body,
                          params={"attribute": str(attribute).lower()}).json()

    def check_batch(self, cells: Iterable[dict], attribute: bool = False, chunk: int = 500) -> list[dict]:
        """cells: {template, case, output} or {template, case, raised[, refusal]}; sent in chunks under the
        service limit."""
        cells = list(cells)
        results = []
        for start in range(0, len(cells), chunk):
            body = {"cells": cells[start:start + chunk], "attribute": attribute}
            results.extend(self._call("POST", self._url("v1", "check", "batch"), json=body).json()["results"])
        return results

    # -- reference and identification ----------------------------------------------------------------------
    def new_goldens(self, template: str, bos_token: Optional[str] = None, eos_token: Optional[str] = None,
                    cases: Optional[list[str]] = None) -> dict:
        body = {"template": template, "bos_token": bos_token, "eos_token": eos_token}
        if cases:
            body["cases"] = cases
        return self._call("POST", self._url("v1", "goldens"), json=body, timeout=max(self.timeout, 180)).json()

    def identify(self, template: Optional[str] = None, sha256: Optional[str] = None) -> dict:
        body = {"template": template} if template is not None else {"sha256": sha256}
        return self._call("POST", self._url("v1", "identify"), json=body).json()


class ServiceJudge:
    """A judge (judge.pipeline.Judge) that asks a `chatgold serve`, which holds the goldens: rendered and
    refused outcomes are judged there; errors, timeouts and skips need no golden and are judged here."""

    def __init__(self, client: ServiceClient, attribute: bool = False):
        self.client = client
        self.attribute = attribute

    def judge(self, runner_name: str, cells) -> list:
        from conformance.judge.pipeline import GoldenJudge
        from runners.base import Raised, RefusalKind, Rendered

        local = GoldenJudge(lambda template_id, case_id: None)  # what needs no golden

        remote = []
        for template_id, case_id, outcome in cells:
            if isinstance(outcome, Rendered):
                remote.append({"template": template_id, "case": case_id, "output": outcome.text})
            elif isinstance(outcome, Raised):
                cell = {"template": template_id, "case": case_id, "raised": outcome.message}
                if outcome.refusal != RefusalKind.UNKNOWN:
                    cell["refusal"] = str(outcome.refusal)
                remote.append(cell)
        judged = iter(self.client.check_batch(remote, attribute=self.attribute)) if remote else iter(())
        results = []
        for template_id, case_id, outcome in cells:
            if isinstance(outcome, (Rendered, Raised)):
                results.append(_result_from_service(runner_name, next(judged), outcome))
            else:
                results.append(local.judge_one(runner_name, template_id, case_id, outcome))
        return results


def _result_from_service(runner_name: str, judged: dict, outcome):
    """The service's judgement as the CellResult a local judge would give the same outcome."""
    from conformance.judge.diff import Divergence
    from conformance.judge.status import CellResult, Status, fingerprint
    from runners.base import Raised, Rendered

    status = Status(judged["status"])
    result = CellResult(
        runner=runner_name, template_id=judged["template"], case_id=judged["case"], status=status,
        divergence=Divergence(**judged["divergence"]) if judged.get("divergence") else None,
        message=outcome.message if isinstance(outcome, Raised) else "",
        output=outcome.text if isinstance(outcome, Rendered) and status != Status.MATCH else None,
        golden_kind=judged.get("golden_kind"),
        refusal=str(outcome.refusal) if isinstance(outcome, Raised) else None,
        reference_message=judged.get("reference_message"), reference_refusal=judged.get("reference_refusal"))
    if judged.get("note"):
        result.note = judged["note"]
    fp = fingerprint(result)
    if fp:
        result.fingerprint = fp
    if judged.get("attribution"):
        result.attribution = {k: v for k, v in judged["attribution"].items() if v is not None}
    return result
