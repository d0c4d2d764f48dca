"""The peer baseline: the tutorial's receiver, FastAPI pushing each body to Redis.

    python bench/peer_server.py PORT REDIS_PORT

(uvicorn with uvloop and httptools; Redis runs with appendfsync always, so an
acknowledged webhook is on disk, as with relay's synchronous = "full").
"""

from __future__ import annotations

import sys

import redis.asyncio as redis
import uvicorn
from fastapi import FastAPI, Request

app = FastAPI()
queue = redis.Redis(host="127.0.0.1", port=int(sys.argv[2]))


@app.post("/hooks/orders")
async def receive(request: Request) -> dict[str, str]:
    body = await request.body()
    await queue.rpush("webhooks", body)
    return {"status": "queued"}


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )
