"""The session engine under every front end: `engine.Engine` owns one cache file's shared parts
in this process (store, parsed statements, plans, result memo, admissions, background work);
`session.Session` is one client's session on it, whose ``execute`` returns a `result.Result`.
The statement router (`route`), the session state the guards see (`state`), background
admissions (`admission`), the administration API (`admin`) and the edge of the public API
(`boundary`) live here too."""
