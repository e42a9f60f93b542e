"""The tabs of the app, one module each (their order: :data:`vit_demo.app.build.TABS`)."""
