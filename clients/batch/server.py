"""Batch runner that sends each record to a server (or several replicas) with the asyncio client."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..aio import AsyncOrtserveClient
from .input import Record
from .tasks import TaskConfig, classification_payload, embedding_payload, fill_mask_payload, generation_payload


class ServerRunner:
    def __init__(self, client: AsyncOrtserveClient, config: TaskConfig) -> None:
        self.client = client
        self.config = config
        self._gen_kwargs = {k: v for k, v in asdict(config.generation).items()}

    async def run(self, record: Record) -> dict[str, Any]:
        c = self.config
        if c.task == "classify":
            results = await self.client.classify([(record.text, record.text_pair)], c.model, version=c.version,
                                                 top_k=c.effective_top_k, truncate=c.truncate)
            return classification_payload(results[0])
        if c.task == "fill-mask":
            results = await self.client.fill_mask([record.text], c.model, version=c.version,
                                                  top_k=c.effective_top_k, truncate=c.truncate)
            return fill_mask_payload(results[0])
        if c.task == "embed":
            vectors = await self.client.embed([record.text], c.model, version=c.version, truncate=c.truncate)
            return embedding_payload(vectors[0].values, vectors[0].tokens)
        result = await self.client.generate(record.text, c.model, version=c.version, **self._gen_kwargs)
        return generation_payload(result, c.generation.wants_logprobs)

    async def close(self) -> None:
        await self.client.close()
