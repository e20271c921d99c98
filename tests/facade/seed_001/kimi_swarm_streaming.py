"""
kimi_swarm_streaming.py
서브 에이전트 결과를 스트리밍으로 즉시 처리
"""
import os
import asyncio
from openai import AsyncOpenAI

client = AsyncOpenAI(
    api_key=os.environ["SWARM_API_KEY"],
    base_url=os.environ["SWARM_FACADE_URL"],
)

async def streaming_swarm(prompt: str):
    stream = await client.chat.completions.create(
        model="kimi-k2.5",
        messages=[
            {"role": "system", "content": "100개 서브 에이전트 swarm 오케스트레이터."},
            {"role": "user", "content": prompt},
        ],
        extra_body={
            "agent_swarm": {
                "enabled": True,
                "max_sub_agents": 100,
                "streaming": True,
                "fan_in_strategy": "concatenate",
            }
        },
        stream=True,
    )

    sub_results = []
    buffer = ""
    async for chunk in stream:
        delta = chunk.choices[0].delta.content or ""
        buffer += delta
        # 서브 에이전트별 구분자: "[SUB_AGENT_N]" 토큰을 기준으로 분리
        while "[SUB_AGENT_" in buffer:
            start = buffer.find("[SUB_AGENT_")
            end = buffer.find("[/SUB_AGENT]", start)
            if end == -1:
                break
            tag_end = buffer.find("]", start)
            agent_id = buffer[start + 11 : tag_end]
            payload = buffer[tag_end + 1 : end]
            sub_results.append({"agent": agent_id, "result": payload.strip()})
            print(f"수신: 에이전트 {agent_id} → {payload[:80]}...")
            buffer = buffer[end + 12 :]
    return sub_results

if __name__ == "__main__":
    asyncio.run(streaming_swarm("100개의 일반적인 API 설계 안티패턴을 나열하라."))
