"""Apache Kafka as the chaos trials' broker, with the jobs' traffic through a proxy.

:class:`ChaosRealKafka` runs one real broker (:class:`~txstore.testing.real_kafka.RealKafkaCluster`,
Kafka 4.1 in KRaft mode) with two client listeners:

- ``PLAINTEXT`` on 127.0.0.1, advertised as itself: the runner's own clients (the
  producers, the checks, the operator's ``txstore`` commands) use it
  (:attr:`ChaosRealKafka.bootstrap_servers`);
- ``CHAOS``, advertised as the address of a :class:`~tests.chaos.proxy.TcpProxy`
  in front of it: the jobs get the proxy's address
  (:attr:`ChaosRealKafka.job_bootstrap_servers`).

Kafka answers a metadata request with the addresses advertised for the listener the
request came in on, so a job that bootstraps through the proxy is told only the proxy's
address and every connection it makes goes through it: freezing or cutting the proxy
freezes or cuts the job's Kafka network, and nothing else's (producing goes on, as it
would from other hosts). That is what the mock cluster cannot do: librdkafka's mock
fixes its listener when it is created, so clients would connect to it directly after
bootstrapping (``kafka-frozen`` delays its answers instead). Startup checks the
metadata seen through the proxy names only the proxy.

The broker is started and restarted by one long-lived thread: ``RealKafkaCluster`` ties
the broker's life to the thread that started it (``setpriv --pdeathsig``), so a restart
from a fault's short-lived thread would kill the broker again when that thread ends.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from tests.chaos.proxy import TcpProxy, frozen_network_available
from txstore.testing.real_kafka import RealKafkaCluster

LISTENER = "CHAOS"
# Kafka 4 refuses messages timestamped over an hour ahead (log.message.timestamp.after.max.ms
# defaults to an hour there): the poison-message kind's timestamp beyond any calendar must get in, as a
# message from a producer with a broken clock does on a broker configured to take it. (Seed 6031:
# the broker refused the poison with INVALID_TIMESTAMP, and the trial failed on the refusal.)
BROKER_CONFIG = {"log.message.timestamp.after.max.ms": str(2**63 - 1)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ChaosRealKafka:
    """A real broker whose job-facing listener is reachable only through a proxy."""

    def __init__(self, workdir: Path, frozen_network: bool | None = None) -> None:
        self._keeper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chaos-kafka")
        self.proxy = TcpProxy(
            "127.0.0.1",
            _free_port(),
            frozen_network=frozen_network_available() if frozen_network is None else frozen_network,
        )
        self.kills = 0
        self._outage = threading.Lock()  # one kill-and-restart at a time
        try:
            advertised = f"{self.proxy.host}:{self.proxy.port}"
            self.cluster = self._keeper.submit(
                RealKafkaCluster,
                workdir=workdir,
                extra_listeners={LISTENER: (self.proxy.target[1], advertised)},
                broker_config=BROKER_CONFIG,
            ).result()
            self._check_advertised()
        except BaseException:
            self.proxy.close()
            self._keeper.shutdown(wait=False)
            raise

    def _check_advertised(self) -> None:
        """Through the proxy, the broker must name the proxy's address and nothing else."""
        admin = AdminClient({"bootstrap.servers": self.job_bootstrap_servers, "log_level": 0})
        brokers = admin.list_topics(timeout=30).brokers
        seen = {f"{b.host}:{b.port}" for b in brokers.values()}
        if seen != {self.job_bootstrap_servers}:
            raise RuntimeError(
                f"through the proxy Kafka advertises {sorted(seen)}, not only {self.job_bootstrap_servers}: "
                "jobs would go around the proxy"
            )

    @property
    def bootstrap_servers(self) -> str:
        """The direct listener: the runner's producers, checks and operator commands."""
        return self.cluster.bootstrap_servers

    @property
    def job_bootstrap_servers(self) -> str:
        """The proxy: what the jobs are given."""
        return f"{self.proxy.host}:{self.proxy.port}"

    # -- topics ---------------------------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int = 1, config: Mapping[str, str] | None = None) -> None:
        self.cluster.create_topic(topic, partitions, config=config)

    def delete_topic(self, topic: str) -> None:
        self.cluster.delete_topic(topic)

    def recreate_topic(self, topic: str, partitions: int = 1) -> None:
        self.cluster.recreate_topic(topic, partitions)

    # -- faults ---------------------------------------------------------------------------------
    def kill_and_restart(self, down_seconds: float) -> float:
        """SIGKILL the broker (no controlled shutdown), leave it down ``down_seconds``, start it
        again (its log recovered) and wait until it answers; return how long the start took."""
        with self._outage:
            self.cluster.kill()
            self.kills += 1
            try:
                time.sleep(down_seconds)
            finally:
                started = time.monotonic()
                self.restart()
        return time.monotonic() - started

    def await_outage_end(self) -> None:
        """Until a kill-and-restart in progress (another fault's) is over."""
        with self._outage:
            pass

    def restart(self) -> None:
        """Start the broker again (same ports and log directory) and wait until it answers."""
        self._keeper.submit(self.cluster.restart).result()

    def ensure_running(self) -> None:
        with self._outage:
            if not self.cluster.running():
                self.restart()

    def close(self) -> None:
        try:
            self._keeper.submit(self.cluster.close).result()
        finally:
            self._keeper.shutdown(wait=True)
            self.proxy.close()
