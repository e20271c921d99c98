"""
kimi_swarm_throttled.py
동시 실행 제한 + 비용 가드가 포함된 프로덕션 버전
"""
import os
import asyncio
import time
from dataclasses import dataclass, field
from openai import AsyncOpenAI

client = AsyncOpenAI(
    api_key=os.environ["SWARM_API_KEY"],
    base_url=os.environ["SWARM_FACADE_URL"],
)

# Kimi K2.5 단가 (2026-01)
PRICE_INPUT_PER_MTOK = 0.60   # USD per million input tokens
PRICE_OUTPUT_PER_MTOK = 2.50  # USD per million output tokens
DAILY_BUDGET_USD = 50.0       # 일일 상한

@dataclass
class CostGuard:
    spent_usd: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def add(self, prompt_tokens: int, completion_tokens: int):
        cost = (
            prompt_tokens / 1_000_000 * PRICE_INPUT_PER_MTOK
            + completion_tokens / 1_000_000 * PRICE_OUTPUT_PER_MTOK
        )
        async with self.lock:
            self.spent_usd += cost
            if self.spent_usd >= DAILY_BUDGET_USD:
                raise RuntimeError(
                    f"일일 예산 초과: ${self.spent_usd:.2f} / ${DAILY_BUDGET_USD}"
                )

guard = CostGuard()
semaphore = asyncio.Semaphore(10)  # 동시 swarm 실행 10개로 제한

async def safe_swarm(prompt: str, agents: int = 100):
    async with semaphore:
        resp = await client.chat.completions.create(
            model="kimi-k2.5",
            messages=[
                {"role": "system", "content": f"루트 오케스트레이터. {agents}개 서브 에이전트 분기."},
                {"role": "user", "content": prompt},
            ],
            extra_body={
                "agent_swarm": {
                    "enabled": True,
                    "max_sub_agents": agents,
                    "fan_in_strategy": "weighted_vote",
                    "failure_tolerance": 0.02,
                }
            },
            max_tokens=4096,
        )
        usage = resp.usage
        await guard.add(usage.prompt_tokens, usage.completion_tokens)
        return resp.choices[0].message.content, usage

async def batch_review(file_summaries: list[str]):
    """여러 swarm 작업을 동시 실행하되 동시성은 semaphore가 제어."""
    tasks = [safe_swarm(s, agents=100) for s in file_summaries]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    ok = [r for r in results if not isinstance(r, Exception)]
    fail = [r for r in results if isinstance(r, Exception)]
    print(f"성공 {len(ok)}건, 실패 {len(fail)}건, 누적 ${guard.spent_usd:.4f}")
    return ok

if __name__ == "__main__":
    summaries = [f"파일 #{i}: 다음 코드를 검토하라..." for i in range(5)]
    asyncio.run(batch_review(summaries))
