"""
kimi_swarm_basic.py
Kimi K2.5 Agent Swarm — 100개 서브 에이전트 기본 호출
"""
import os
import asyncio
from openai import AsyncOpenAI

# 게이트웨이 (해외 신용카드 불필요, 로컬 결제 지원)
client = AsyncOpenAI(
    api_key=os.environ["SWARM_API_KEY"],
    base_url=os.environ["SWARM_FACADE_URL"],
)

async def run_swarm(prompt: str, num_sub_agents: int = 100):
    """
    Kimi K2.5 swarm 모드로 서브 에이전트 N개를 병렬 실행.
    """
    response = await client.chat.completions.create(
        model="kimi-k2.5",
        messages=[
            {
                "role": "system",
                "content": (
                    "당신은 루트 오케스트레이터입니다. "
                    f"사용자 작업을 {num_sub_agents}개의 독립 서브 작업으로 분해하고, "
                    "각 서브 에이전트에 병렬로 위임한 뒤 결과를 종합하세요."
                ),
            },
            {"role": "user", "content": prompt},
        ],
        extra_body={
            "agent_swarm": {
                "enabled": True,
                "max_sub_agents": num_sub_agents,
                "fan_in_strategy": "weighted_vote",
                "failure_tolerance": 0.02,  # 2%까지 실패 허용
            }
        },
        temperature=0.3,
        max_tokens=4096,
    )
    return response.choices[0].message.content

async def main():
    task = """
    다음 100개 Python 파일 각각에 대해 보안 취약점을 검토하라:
    1. SQL 인젝션 가능성
    2. 하드코딩된 비밀키
    3. 안전하지 않은 역직렬화
    각 파일에 1~2문장으로 요약하고 심각도(critical/high/medium/low)를 부여하라.
    """
    result = await run_swarm(task, num_sub_agents=100)
    print(result)

if __name__ == "__main__":
    asyncio.run(main())
