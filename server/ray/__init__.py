"""ortserve on Ray Serve (the optional extra `ray`; the base server never imports this package or ray).

    deployment.py  the Ray Serve deployment: a DataPlane per replica, the server's Starlette app as its ingress,
                   replica / autoscaling options, the `serve run` application builder
    __main__.py    `python -m server.ray`: join or start Ray, deploy, drain on SIGTERM
"""
