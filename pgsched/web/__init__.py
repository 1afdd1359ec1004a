"""`pgsched web`: a server-rendered dashboard (Starlette, Jinja2, uvicorn; the extra
`pgsched[web]`). `sessions` owns sign-in, the per-session PostgreSQL connection and CSRF;
`charts` turns rows into SVG geometry (pure); `words` says a schedule in plain words;
`app` maps URLs to the queries and actions of pgsched/ops; `server` checks the listen
address and runs uvicorn. Templates, CSS and JavaScript ship inside the package."""
