"""Where engine targets come from besides the configuration: local processes and pods."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from exporter.engines import process_tree
from exporter.engines.targets import Target

if TYPE_CHECKING:
    from exporter.k8s.pods import PodInfo


def local_processes() -> list[Target]:
    """Engine servers running on this node, from their command line and listening port."""
    return [
        Target(url=f.url, kind=f.kind, source="process", root_pid=f.pid)
        for f in process_tree.discover(own_pid=os.getpid())
    ]


def kubernetes(
    node: str,
    annotation: str,
    lister: Callable[[str], Sequence[PodInfo]] | None = None,
) -> Callable[[], list[Target]]:
    """A discoverer of this node's pods that carry the opt-in scrape annotation.

    The port, path, scheme and engine annotations share the scrape annotation's prefix
    (exporter.k8s.pods.EngineAnnotations). `lister` defaults to the API server listing
    of exporter.k8s.pods, with the in-cluster service account.
    """

    def discover() -> list[Target]:
        from exporter.k8s.pods import EngineAnnotations, engine_targets, list_node_pods

        pods = list(lister(node) if lister is not None else list_node_pods(node))
        uids = {(p.namespace, p.name): p.uid for p in pods}
        names = EngineAnnotations.from_scrape_annotation(annotation)
        out = []
        for found in engine_targets(pods, names):
            kind = (found.engine or "").strip().lower() or None
            out.append(
                Target(
                    url=found.url,
                    kind=kind if kind in ("vllm", "sglang", "tgi") else None,
                    source="kubernetes",
                    namespace=found.namespace,
                    pod=found.pod,
                    pod_uid=uids.get((found.namespace, found.pod)),
                )
            )
        return out

    return discover
