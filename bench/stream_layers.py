"""Per-chunk cost of the layers between a sequence's queue and the SSE writer's `merged` (one stream), on a stand-in
sequence whose queue holds every chunk already: `PYTHONPATH=TREE python -m bench.stream_layers LABEL`. On main the
stack is SequenceStream -> _Mapped -> StreamParts -> _parts -> _merge; on the one stream path, RequestStream calling
the sequence's own next_chunk -> merged (bench/FINDINGS.md, "One stream path")."""
import asyncio
import statistics
import sys
import time
from types import SimpleNamespace

from server.generation.results import StreamChunk
from server.generation.streams import SequenceStream
from server.http.openai import stream as sse_stream
import server.leases as leases

N = 20000


class Seq:
    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finish_reason = None
        for _ in range(N - 1):
            self.queue.put_nowait(StreamChunk(text="a"))
        self.queue.put_nowait(StreamChunk(text="", final=True, finish_reason="length"))

    @property
    def done(self) -> bool:
        return False

    async def next_chunk(self):
        return await self.queue.get()


class FakeLease:
    span = None

    def __exit__(self, *a):
        pass


served = SimpleNamespace(name="m", version=1)


def build(seq):
    held = leases.SharedLease(FakeLease(), 1)
    source = SequenceStream(seq, lambda s: None)
    if hasattr(leases, "RequestStream"):
        return leases.RequestStream(served, source, None, held)
    from server.generation.decoder_model import _Mapped
    return leases.StreamParts(served, _Mapped(source), None, held)


async def one() -> float:
    seq = Seq()
    st = build(seq)
    first = await st.__anext__()
    t = time.perf_counter()
    n = 0
    async for _ in sse_stream.merged([first], [st]):
        n += 1
    assert n == N
    return (time.perf_counter() - t) / (N - 1) * 1e6


async def main() -> None:
    runs = [await one() for _ in range(15)]
    print(f"{sys.argv[1] if len(sys.argv) > 1 else 'this tree'}: {statistics.median(runs):.2f} us per chunk (median of 15 x {N} chunks), min {min(runs):.2f}")

if __name__ == "__main__":
    asyncio.run(main())
