"""Clients that misbehave on purpose: what an ordinary client does when it cancels, times out or
disconnects, done many times at once, to prove that no client can take the service down.

    python -m fusedresnet.campaigns.client_abuse abandon --url 127.0.0.1:8001 --model resnet18_custom \\
        --rounds 10 --in-flight 256 --hold 1.0

gRPC behaviours run on `grpc.aio` with pre-serialised ModelInfer requests (one request costs the
sender almost nothing, so 2 cores can keep hundreds in flight), each channel with a connection of
its own (a local subchannel pool: gRPC otherwise shares one connection among a process's channels):

- `abandon`: each round opens `connections` channels, puts `in_flight` calls in flight and closes
  the channels `hold_s` later, whatever is still running (gRPC cancels those calls: RST_STREAM, then
  the connection goes). Triton 2.51 can abort on this (`sync.cc:105 ASSERTION FAILED: prior > 0`).
- `deadlines`: calls with a short gRPC deadline under load; the server sees them expire.
- `rst_storm`: calls cancelled right after they are sent, as fast as the client can.

Connection-level behaviours use plain sockets (HTTP/1.1 for Triton's HTTP port, the HTTP/2 client
preface for its gRPC port): `idle_connections` held open, `slow_http_bodies` (sent a few bytes at a
time, or cut short), `keepalive_abuse` (pipelined and never-read requests on kept-alive connections).
Connection storms use h2load (Debian's nghttp2-client): `connection_storm`.

Every gRPC call's outcome is kept: the logits of an answer (checked by the caller against its own
reference), the gRPC status of an error, or "abandoned" (the client gave up before an answer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fusedresnet.backend.spec import DEFAULT_GRPC_URL, INPUT_SHAPES, INPUT_UINT8, NUM_CLASSES, OUTPUT_LOGITS
from fusedresnet.client.resnet_client import RETRY_BACKOFF_S, backoff_waits
from fusedresnet.loadtest.h2load_step import h2load_path
from fusedresnet.loadtest.raw_grpc import MODEL_INFER, grpc_frame, infer_request

ABANDONED = "ABANDONED"
LOCAL_CONNECTION = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", -1),
                    ("grpc.max_send_message_length", -1)]
CLOSE_WAIT_S = 10.0
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def logits_of(response) -> np.ndarray:
    return np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(-1, NUM_CLASSES)


@dataclass
class CallOutcomes:
    """What became of every call of a behaviour: answers by request index, errors and give-ups by status."""

    sent: int = 0
    answers: list[tuple[int, np.ndarray]] = field(default_factory=list)   # (request index, logits)
    statuses: Counter = field(default_factory=Counter)                   # status name -> count ("OK" too)
    error_examples: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    stuck_after_close: int = 0     # calls that had not ended CLOSE_WAIT_S after their connection closed

    def add(self, index: int, outcome):
        if isinstance(outcome, np.ndarray):
            self.answers.append((index, outcome))
            self.statuses["OK"] += 1
        else:
            status, details = outcome
            self.statuses[status] += 1
            self.error_examples.setdefault(status, details[:200])

    def merge(self, other: CallOutcomes) -> CallOutcomes:
        self.sent += other.sent
        self.answers += other.answers
        self.statuses.update(other.statuses)
        for status, example in other.error_examples.items():
            self.error_examples.setdefault(status, example)
        self.seconds += other.seconds
        self.stuck_after_close += other.stuck_after_close
        return self

    def summary(self) -> dict:
        return {"sent": self.sent, "statuses": dict(sorted(self.statuses.items())),
                "error_examples": self.error_examples, "seconds": round(self.seconds, 2),
                "stuck_after_close": self.stuck_after_close}


async def _outcome(call):
    import grpc

    try:
        return logits_of(await call)
    except asyncio.CancelledError:
        return ABANDONED, "the client cancelled the call or closed its connection"
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.CANCELLED and "Locally cancelled" in (error.details() or ""):
            return ABANDONED, error.details() or ""
        return error.code().name, error.details() or ""


def _channels(url: str, count: int):
    import grpc
    from tritonclient.grpc import service_pb2

    channels = [grpc.aio.insecure_channel(url, options=LOCAL_CONNECTION) for _ in range(count)]
    infer = [channel.unary_unary(MODEL_INFER, request_serializer=None,
                                 response_deserializer=service_pb2.ModelInferResponse.FromString)
             for channel in channels]
    return channels, infer


async def _abandon_round(url: str, requests: list[bytes], first: int, in_flight: int, hold_s: float,
                         connections: int) -> CallOutcomes:
    """`in_flight` calls kept in flight (each answered one is replaced by the next) for `hold_s`, then
    the connections closed with whatever is still in flight, as a load generator ends a step."""
    outcomes = CallOutcomes()
    started = time.monotonic()
    channels, infer = _channels(url, connections)
    closing = False

    async def worker(slot: int):
        while not closing:
            index = first + outcomes.sent
            outcomes.sent += 1
            outcomes.add(index, await _outcome(infer[slot % connections](requests[index % len(requests)])))

    workers = [asyncio.ensure_future(worker(slot)) for slot in range(in_flight)]
    await asyncio.sleep(hold_s)
    closing = True
    for channel in channels:
        await channel.close(grace=None)   # whatever is still in flight is abandoned with the connection
    # A call of a closed channel may never complete in grpc.aio: give up on it (it counts as abandoned)
    _, stuck = await asyncio.wait(workers, timeout=CLOSE_WAIT_S)
    for worker_task in stuck:
        worker_task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    outcomes.stuck_after_close += len(stuck)
    outcomes.seconds = time.monotonic() - started
    return outcomes


def abandon(url: str, requests: list[bytes], rounds: int, in_flight: int = 256, hold_s: float = 1.0,
            connections: int = 1, between_s: float = 0.0, stop=None) -> list[CallOutcomes]:
    """`rounds` rounds of: `in_flight` calls kept in flight over `connections` fresh connections for
    `hold_s`, then the connections closed with whatever is still in flight. `stop()` (optional) is
    asked between rounds (e.g. "has the server died?"). Returns each round's outcomes."""
    results = []
    for _ in range(rounds):
        first = sum(result.sent for result in results)
        results.append(asyncio.run(_abandon_round(url, requests, first, in_flight, hold_s, connections)))
        if stop is not None and stop():
            break
        time.sleep(between_s)
    return results


async def _steady(url: str, requests: list[bytes], count: int, in_flight: int, connections: int,
                  deadline_s: float | None, cancel_after_s: float | None) -> CallOutcomes:
    """`count` calls, `in_flight` at a time; each with gRPC deadline `deadline_s`, or cancelled by the
    client `cancel_after_s` after it was sent (0: as soon as it went out)."""
    outcomes = CallOutcomes(sent=count)
    started = time.monotonic()
    channels, infer = _channels(url, connections)
    next_index = 0

    async def worker(slot: int):
        nonlocal next_index
        while next_index < count:
            index = next_index
            next_index += 1
            call = infer[slot % connections](requests[index % len(requests)], timeout=deadline_s)
            if cancel_after_s is not None:
                await asyncio.sleep(cancel_after_s)
                call.cancel()
            outcomes.add(index, await _outcome(call))

    try:
        await asyncio.gather(*(worker(slot) for slot in range(in_flight)))
    finally:
        for channel in channels:
            await channel.close(grace=None)
    outcomes.seconds = time.monotonic() - started
    return outcomes


def deadlines(url: str, requests: list[bytes], count: int, in_flight: int = 64, deadline_s: float = 0.05,
              connections: int = 4) -> CallOutcomes:
    """`count` calls with a gRPC deadline of `deadline_s`, `in_flight` at a time: under load most expire."""
    return asyncio.run(_steady(url, requests, count, in_flight, connections, deadline_s, None))


def rst_storm(url: str, requests: list[bytes], count: int, in_flight: int = 32, connections: int = 2,
              cancel_after_s: float = 0.0) -> CallOutcomes:
    """`count` calls, each cancelled by the client (RST_STREAM) `cancel_after_s` after it was sent."""
    return asyncio.run(_steady(url, requests, count, in_flight, connections, None, cancel_after_s))


def valid_calls(url: str, requests: list[bytes], count: int, in_flight: int = 8) -> CallOutcomes:
    """`count` ordinary calls (no deadline, never cancelled), `in_flight` at a time."""
    return asyncio.run(_steady(url, requests, count, in_flight, 2, 120.0, None))


VALID_DEADLINE_S = 60.0          # a valid request unanswered this long after it was first sent is lost
VALID_RETRY_BACKOFF_S = RETRY_BACKOFF_S   # first and longest wait before a retry (doubling), as the project's clients
# gRPC waits up to 120 s between reconnection attempts (1 s, x1.6 each): after a 10-s restart a channel would
# stay down for seconds more with the server back; the valid clients try again every second at most
VALID_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.max_reconnect_backoff_ms", 1000)]
VALID_UNTIL_FILE_MAX_S = 600.0   # past `seconds`, at most this long waiting for `until_file`


async def _valid_for(url: str, requests: list[bytes], seconds: float, in_flight: int,
                     deadline_s: float = VALID_DEADLINE_S, first_answer_file: Path | None = None,
                     until_file: Path | None = None) -> dict:
    """Valid calls kept `in_flight` for `seconds`, each answered one replaced by the next, sent as a real client
    of the project does: on channels with its retry policy (client/resnet_client.grpc_channel; reconnection
    attempts at most VALID_RECONNECT apart), and retried here
    too on UNAVAILABLE (a server that restarts refuses connections for longer than gRPC's own retries last),
    with backoff, until `deadline_s` after the request was first sent. A request is lost only if it never got
    an answer (another status, or UNAVAILABLE past its deadline); every answer is compared with this run's first
    answer to the same request (relative L2 within IMAGE_REL_L2_TOLERANCE). Answered images are counted per
    second of the epoch ("answered_images_by_second") for the soak's timeline, answered requests per tenth of a
    second of the epoch ("answered_by_tenth_s": bin b holds the answers received in [b/10, (b+1)/10) s) for its
    judgement around a restart. `first_answer_file` (optional) is written with the time of the first answer (the
    soak aborts the server once every valid process has been answered); with `until_file`, calls go on past
    `seconds` until that file exists (at most VALID_UNTIL_FILE_MAX_S more: the soak says when it has seen enough)."""
    import grpc

    from fusedresnet.client.agreement import IMAGE_REL_L2_TOLERANCE, relative_l2
    from fusedresnet.client.resnet_client import grpc_channel

    target, channel_args = grpc_channel(url)
    first_answers: dict[int, np.ndarray] = {}
    figures = Counter()            # sent, answered_first_time, answered_after_retry, lost, retries, mismatched
    statuses, lost_examples, retry_examples = Counter(), [], []
    by_second: Counter = Counter()
    by_tenth: Counter = Counter()
    longest_s = 0.0
    channels = [grpc.aio.insecure_channel(target, options=[*channel_args, *VALID_RECONNECT,
                                                            ("grpc.use_local_subchannel_pool", 1)])
                for _ in range(max(1, in_flight // 8))]
    infer = [channel.unary_unary(MODEL_INFER, request_serializer=None,
                                 response_deserializer=_response_type().FromString) for channel in channels]
    end = time.monotonic() + seconds

    def going() -> bool:
        now = time.monotonic()
        return now < end or (until_file is not None and now < end + VALID_UNTIL_FILE_MAX_S
                             and not Path(until_file).exists())

    async def worker(slot: int):
        nonlocal longest_s
        while going():
            index = (slot + figures["sent"]) % len(requests)
            figures["sent"] += 1
            first_sent, attempt, waits = time.monotonic(), 0, backoff_waits(*VALID_RETRY_BACKOFF_S)
            while True:
                left = deadline_s - (time.monotonic() - first_sent)
                outcome = await _outcome(infer[slot % len(infer)](requests[index], timeout=max(left, 0.001)))
                wait = next(waits)
                if isinstance(outcome, np.ndarray) or outcome[0] != "UNAVAILABLE" \
                        or time.monotonic() - first_sent + wait >= deadline_s:
                    break
                attempt += 1
                figures["retries"] += 1
                if len(retry_examples) < 5:
                    retry_examples.append((time.time(), f"{outcome[0]}: {outcome[1][:160]}"))
                await asyncio.sleep(wait)
            if isinstance(outcome, np.ndarray):
                statuses["OK"] += 1
                figures["answered_after_retry" if attempt else "answered_first_time"] += 1
                longest_s = max(longest_s, time.monotonic() - first_sent)
                answered_at = time.time()
                by_second[int(answered_at)] += len(outcome)
                by_tenth[int(answered_at * 10)] += 1
                if first_answer_file is not None and statuses["OK"] == 1:
                    Path(first_answer_file).write_text(f"{answered_at}\n")
                reference = first_answers.setdefault(index, outcome)
                figures["mismatched"] += relative_l2(outcome, reference) > IMAGE_REL_L2_TOLERANCE
            else:
                statuses[outcome[0]] += 1
                figures["lost"] += 1
                lost_examples.append((time.time(), f"{outcome[0]} after {attempt} retries: {outcome[1][:160]}"))

    try:
        await asyncio.gather(*(worker(slot) for slot in range(in_flight)))
    finally:
        for channel in channels:
            await channel.close(grace=None)
    return {**{key: int(figures[key]) for key in ("sent", "answered_first_time", "answered_after_retry", "lost",
                                                   "retries", "mismatched")},
            "statuses": dict(statuses), "longest_to_answer_s": round(longest_s, 3), "deadline_s": deadline_s,
            "failures": lost_examples, "retry_examples": retry_examples,
            "answered_images_by_second": {str(second): count for second, count in sorted(by_second.items())},
            "answered_by_tenth_s": {str(tenth): count for tenth, count in sorted(by_tenth.items())}}


def _response_type():
    from tritonclient.grpc import service_pb2
    return service_pb2.ModelInferResponse


def valid_for(url: str, requests: list[bytes], seconds: float, in_flight: int = 16,
              deadline_s: float = VALID_DEADLINE_S, first_answer_file: Path | None = None,
              until_file: Path | None = None) -> dict:
    return asyncio.run(_valid_for(url, requests, seconds, in_flight, deadline_s, first_answer_file, until_file))


# ---------------------------------------------------------------- connections


@contextlib.contextmanager
def idle_connections(host: str, port: int, count: int, preface: bytes = b""):
    """`count` TCP connections to host:port held open and silent (after `preface`, e.g. the HTTP/2
    client preface) while the block runs. Yields the number that connected."""
    sockets = []
    try:
        for _ in range(count):
            connection = socket.create_connection((host, port), timeout=10)
            if preface:
                connection.sendall(preface)
            sockets.append(connection)
        yield len(sockets)
    finally:
        for connection in sockets:
            connection.close()


def http_infer_message(model: str, images: np.ndarray, host: str) -> tuple[bytes, bytes]:
    """(HTTP/1.1 request head, body) of a binary-tensor infer request for uint8 images [N,224,224,3]."""
    pixels = np.ascontiguousarray(images, dtype=np.uint8).tobytes()
    header = json.dumps({"inputs": [{"name": INPUT_UINT8, "datatype": "UINT8", "shape": list(images.shape),
                                     "parameters": {"binary_data_size": len(pixels)}}],
                         "outputs": [{"name": OUTPUT_LOGITS, "parameters": {"binary_data": False}}]}).encode()
    body = header + pixels
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head, body


def slow_http_bodies(host: str, port: int, head: bytes, body: bytes, connections: int = 16,
                     chunk: int = 64, interval_s: float = 0.05, seconds: float = 4.0) -> dict:
    """`connections` infer requests (LOGITS asked as JSON) whose bodies trickle in `chunk` bytes every
    `interval_s`; after `seconds` half of them are cut short (the connection closed mid-body) and the
    other half are finished, their answers read. Returns the HTTP status lines of the finished ones,
    and their bodies (in order) under "bodies"."""
    sockets = []
    for _ in range(connections):
        connection = socket.create_connection((host, port), timeout=30)
        connection.sendall(head)
        sockets.append(connection)
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and sent + chunk < len(body):
        for connection in sockets:
            connection.sendall(body[sent:sent + chunk])
        sent += chunk
        time.sleep(interval_s)
    cut, finished = sockets[::2], sockets[1::2]
    for connection in cut:
        connection.close()
    statuses, bodies = Counter(), []
    for connection in finished:
        connection.sendall(body[sent:])
        status, answer = _read_http_response(connection)
        statuses[status] += 1
        bodies.append(answer)
        connection.close()
    return {"cut_short": len(cut), "finished": len(finished), "bytes_before_cut": sent,
            "finished_statuses": dict(statuses), "bodies": bodies}


def _read_http_response(connection: socket.socket) -> tuple[str, bytes]:
    """(status line, body) of one HTTP/1.1 response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = connection.recv(65536)
        if not piece:
            return "closed", b""
        data += piece
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode(errors="replace").split("\r\n")
    length = next((int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")), 0)
    while len(rest) < length:
        piece = connection.recv(65536)
        if not piece:
            break
        rest += piece
    return lines[0], rest[:length]


def keepalive_abuse(host: str, port: int, sequential: int = 200, pipelined: int = 50, unread_connections: int = 64,
                    unread_requests: int = 50, answer_wait_s: float = 3.0) -> dict:
    """HTTP/1.1 keep-alive abused three ways, with GETs of /v2/health/ready: `sequential` requests one
    after the other on one kept-alive connection (each answered before the next); `pipelined` requests
    written at once on one connection before any answer is read (the answers that came within
    `answer_wait_s` of each other are counted: Triton 2.51's HTTP server answers only the first);
    and `unread_connections` connections that each write `unread_requests` requests and close
    without reading a byte."""
    request = f"GET /v2/health/ready HTTP/1.1\r\nHost: {host}\r\nConnection: keep-alive\r\n\r\n".encode()
    with socket.create_connection((host, port), timeout=30) as connection:
        sequential_answers = Counter()
        for _ in range(sequential):
            connection.sendall(request)
            sequential_answers[_read_http_response(connection)[0]] += 1
    pipelined_answers = Counter()
    with socket.create_connection((host, port), timeout=answer_wait_s) as connection:
        connection.sendall(request * pipelined)
        with contextlib.suppress(TimeoutError, OSError):
            for _ in range(pipelined):
                pipelined_answers[_read_http_response(connection)[0]] += 1
    for _ in range(unread_connections):
        with socket.create_connection((host, port), timeout=30) as connection:
            connection.sendall(request * unread_requests)
    return {"sequential": sequential, "sequential_answers": dict(sequential_answers), "pipelined": pipelined,
            "pipelined_answers": dict(pipelined_answers), "unread_connections": unread_connections,
            "unread_requests_each": unread_requests}


SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"


def connection_storm(url: str, connections: int = 1000, grpc_method: str | None = SERVER_LIVE,
                     request: bytes = b"", http_path: str = "/v2/health/ready", threads: int = 2,
                     timeout_s: float = 120.0) -> dict:
    """h2load opens `connections` connections at once, one request each: a gRPC call of `grpc_method`
    with `request` (HTTP/2 to Triton's gRPC port), or with grpc_method=None an HTTP/1.1 GET of
    `http_path`. Returns h2load's counts (its statuses are HTTP statuses, not gRPC ones)."""
    # here, not at the top: loadtest.h2load_step imports torch (5-6 s of a core), which the valid clients, started
    # by the soak on a busy load core, do not need before their first answer
    from fusedresnet.loadtest.h2load_step import parse_h2load

    binary = h2load_path()
    if binary is None:
        raise FileNotFoundError("h2load not found: install Debian's nghttp2-client")
    common = ["-c", str(connections), "-n", str(connections), "-t", str(threads), "-m", "1",
              "-T", str(int(timeout_s)), "-N", str(int(timeout_s))]
    with tempfile.NamedTemporaryFile(suffix=".grpc") as body:
        if grpc_method is None:
            command = [binary, "--h1", f"http://{url}{http_path}", *common]
        else:
            Path(body.name).write_bytes(grpc_frame(request))
            command = [binary, f"http://{url}{grpc_method}", *common, "-d", body.name,
                       "-H", "content-type: application/grpc", "-H", "te: trailers"]
        finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 30)
    return {"command": " ".join(["h2load", command[1] if command[1] != "--h1" else "--h1", *common]),
            "exit_status": finished.returncode, **parse_h2load(finished.stdout)}


# ---------------------------------------------------------------- CLI


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("behaviour", choices=("abandon", "deadlines", "rst-storm", "valid"))
    parser.add_argument("--url", default=DEFAULT_GRPC_URL)
    parser.add_argument("--model", default="resnet18_custom")
    parser.add_argument("--images-per-request", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10, help="abandon: rounds")
    parser.add_argument("--count", type=int, default=2000, help="deadlines, rst-storm: calls")
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--hold", type=float, default=1.0, help="abandon: seconds before the connections close")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=0.05, help="deadlines: seconds")
    parser.add_argument("--seconds", type=float, default=60.0, help="valid: seconds of valid load")
    parser.add_argument("--deadline-s", type=float, default=VALID_DEADLINE_S,
                        help="valid: a request unanswered this long after it was first sent (retries included) is lost")
    parser.add_argument("--first-answer-file", type=Path,
                        help="valid: written with the time of the first answer")
    parser.add_argument("--until-file", type=Path,
                        help=f"valid: after --seconds, go on until this file exists (at most "
                             f"{VALID_UNTIL_FILE_MAX_S:.0f} s more)")
    parser.add_argument("--seed", type=int, default=3, help="of the images")
    args = parser.parse_args(argv)
    images = np.random.default_rng(args.seed).integers(
        0, 256, (8 + args.images_per_request, *INPUT_SHAPES[INPUT_UINT8]), dtype=np.uint8)
    requests = [infer_request(args.model, images[i:i + args.images_per_request])
                for i in range(8)]
    if args.behaviour == "valid":
        print(json.dumps(valid_for(args.url, requests, args.seconds, args.in_flight, args.deadline_s,
                                   args.first_answer_file, args.until_file)))
        return
    if args.behaviour == "abandon":
        rounds = abandon(args.url, requests, args.rounds, args.in_flight, args.hold, args.connections)
        outcome = CallOutcomes()
        for one in rounds:
            outcome.merge(one)
    elif args.behaviour == "deadlines":
        outcome = deadlines(args.url, requests, args.count, args.in_flight, args.deadline, args.connections)
    else:
        outcome = rst_storm(args.url, requests, args.count, args.in_flight, args.connections)
    print(json.dumps(outcome.summary(), indent=2))


if __name__ == "__main__":
    main()
