#!/bin/sh
# A non-Python agent: agent spec `exec:agents/shell_agent.sh`.
# Contract (areal/agent.py): the dataset row arrives as JSON on stdin; OPENAI_BASE_URL and
# OPENAI_API_KEY point at the sandbox's relay; the last line on stdout is the reward, a JSON
# number or a {"completion_id": reward} object. Any non-zero exit fails the episode.
# Reward: 1 when the reply contains the row's "answer" (the embedded task's boxed answer).
set -eu
row=$(cat)
question=$(printf '%s' "$row" | sed -n 's/.*"question": *"\([^"]*\)".*/\1/p')
answer=$(printf '%s' "$row" | sed -n 's/.*"answer": *"\{0,1\}\([^",}]*\)"\{0,1\}.*/\1/p')
body=$(printf '{"model":"areal","messages":[{"role":"user","content":"%s"}]}' "$question")
reply=$(curl -sS --fail-with-body --max-time 120 -H "Authorization: Bearer $OPENAI_API_KEY" \
  -H "Content-Type: application/json" -d "$body" "$OPENAI_BASE_URL/chat/completions")
echo "reply: $reply" >&2
case "$reply" in
  *"$answer"*) echo 1.0 ;;
  *) echo 0.0 ;;
esac
