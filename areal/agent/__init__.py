"""The agent side: what runs an episode's agent code, in a sandbox or inline, and what it reports.

- ``spec``: an agent spec (``module:attr``, a file, ``exec:`` program) loaded into an ``AgentRun``;
  its result checked and turned into an ``EpisodeOutcome``; the inline runner; the SDK clients
  handed out to agents.
- ``failures``: the failure classes (policy / agent / infrastructure) and what decides them.
- ``environment``: the endpoint variables (``OPENAI_BASE_URL``, ...) an episode reads, the same
  sandboxed and inline, where concurrent episodes share one process.
- ``httpx2_bridge``: SDKs built on httpx2 routed through the same handed-out clients.
- ``context``, ``groups``, ``stats``: AReaL-style workflows (``arun_episode``) run by the
  controller: the call's context, how one call's sessions become groups, the statistics they record.

The sandbox (``sandbox/``) and the controller (``areal/controller/``) import this side; it
imports neither.
"""
