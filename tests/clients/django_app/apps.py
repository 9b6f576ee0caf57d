from django.apps import AppConfig


class DjangoAppConfig(AppConfig):
    name = "clients.django_app"
    label = "shop"
