"""The model server: one inference backend behind the ``/v1`` contract of ``corl.proto``.

``app.create_app`` builds the FastAPI app; ``testing.running_server`` runs it on loopback.
"""
