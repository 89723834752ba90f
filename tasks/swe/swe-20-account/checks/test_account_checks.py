import pytest
from ledger.account import Account, InsufficientFunds


def test_withdraw_all():
    a = Account(10)
    a.withdraw(10)
    assert a.balance == 0


def test_empty_account():
    with pytest.raises(InsufficientFunds):
        Account().withdraw(1)


def test_negative_withdrawal():
    with pytest.raises(ValueError):
        Account(5).withdraw(-1)
