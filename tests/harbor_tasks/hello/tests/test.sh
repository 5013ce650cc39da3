#!/bin/bash
# Run by Harbor's verifier after the agent; the reward is what it reads back.
if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
