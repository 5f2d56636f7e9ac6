"""The caller's principal rides in a context variable; a Lease stream closed from
another context (a cancelled call's generator finalized elsewhere) must not raise
"was created in a different Context" (logged as an ERROR traceback on every disconnect)."""

from __future__ import annotations

import asyncio
import contextvars

from dtq_gateway.rpc import auth


async def test_stream_wrapper_closes_cleanly_from_another_context():
    seen = []

    async def behavior(request, context):
        seen.append(auth.current_principal())
        while True:
            yield "item"
            await asyncio.sleep(0)

    principal = auth.Principal(role="worker", identity="alice")
    wrapped = auth._with_principal(principal)(behavior)
    gen = wrapped(None, None)
    assert await gen.__anext__() == "item"
    # closed the way asyncio's async-generator finalizer or a cancelled call does: from a
    # task running in another context than the one that set the variable
    done = asyncio.get_running_loop().create_task(gen.aclose(), context=contextvars.Context())
    await done  # raised ValueError("... was created in a different Context") before
    assert seen == [principal]
    assert auth.current_principal() is None


async def test_unary_wrapper_sets_the_principal_for_the_call_only():
    async def behavior(request, context):
        return auth.current_principal()

    principal = auth.Principal(role="admin", identity="ops")
    run = auth._with_principal(principal)(behavior)
    assert await asyncio.get_running_loop().create_task(run(None, None)) == principal
    assert auth.current_principal() is None
