"""Hand-written text of the tiny default: 40 topics (customer service and health, English and Chinese).

Each topic has one keyword that every one of its questions contains, five questions (easy, medium,
medium, hard, easy) and two answer sentences that do not name the keyword. An answer names its topic
through a per-group frame sentence ("Here is some advice about your {keyword}."), i.e. by copying the
keyword from the question: a skill a tiny transformer learns from a few dozen examples and carries over
to unseen phrasings, unlike recalling which sentence belongs to which topic. build_tiny_assets.py
composes questions, SFT responses and case-wise rubric criteria from these tables.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Topic:
    """One question topic: its keyword, five phrasings and the sentences an answer is built from."""

    category: str
    lang: str
    keyword: str
    questions: tuple[str, str, str, str, str]
    extra: str
    more: str


DIFFICULTIES = ("easy", "medium", "medium", "hard", "easy")


def _t(category: str, lang: str, keyword: str, questions: list[str], extra: str, more: str) -> Topic:
    return Topic(category, lang, keyword, tuple(questions), extra, more)  # type: ignore[arg-type]


CS, HEALTH = "customer_service", "health"

TOPICS: tuple[Topic, ...] = (
    # ------------------------------------------------------------------ customer service, English
    _t(CS, "en", "refund", [
        "How do I get a refund for my order?",
        "I was charged twice, can I get a refund for one of the payments?",
        "What is your refund policy for items bought on sale?",
        "My refund was approved a week ago but I still have not received the money, and the seller is not answering. What should I do?",
        "Can I ask for a refund after 30 days?",
    ],
        "Approved payments return to your original card within 5 business days.",
        "If the money is late, send us the payment date and we will check it."),
    _t(CS, "en", "delivery", [
        "When will my delivery arrive?",
        "The tracking page has not changed for three days. Is my delivery lost?",
        "Can I change the delivery time to the weekend?",
        "My delivery was marked as received but nothing was at my door, and my neighbour did not see it either. What can you do?",
        "Do you offer free delivery?",
    ],
        "You can follow the parcel with the tracking link in your email.",
        "If the parcel is missing, we will open a search with the courier."),
    _t(CS, "en", "password", [
        "I forgot my password, how can I reset it?",
        "The password reset email never arrives. What should I do?",
        "How often should I change my password?",
        "Someone changed my password and I cannot log in anymore, and my email may also be hacked. How do I get my account back?",
        "Can I use the same password on the app and the website?",
    ],
        "The reset link is valid for one hour, so please check your spam folder.",
        "For safety, we never ask for your code by phone or chat."),
    _t(CS, "en", "invoice", [
        "How can I download an invoice for my purchase?",
        "The company name on my invoice is wrong. Can you fix it?",
        "Can I get one invoice for several orders?",
        "I need an invoice with my tax number for last year's orders, but the orders are already closed. Is that still possible?",
        "Is the invoice sent by email?",
    ],
        "To change the billing name, send us the correct details and we will issue a new copy.",
        "Closed orders can still be found in your order history."),
    _t(CS, "en", "warranty", [
        "How long is the warranty on this laptop?",
        "My headphones stopped working after two months. Are they covered by the warranty?",
        "Does the warranty cover water damage?",
        "I lost the receipt, the product broke after ten months, and the shop has closed. Can I still use the warranty?",
        "Can I extend the warranty?",
    ],
        "Please keep the serial number ready when you contact the repair team.",
        "Damage from accidents or water is not included."),
    _t(CS, "en", "subscription", [
        "How do I cancel my subscription?",
        "I was charged for a subscription I thought I had cancelled. Can you help?",
        "Can I pause my subscription for a month?",
        "My subscription renewed at a higher price without notice and I want to switch to the yearly plan instead. What are my options?",
        "Will I lose my data if the subscription ends?",
    ],
        "Your plan stays active until the end of the current billing period.",
        "If you were charged after cancelling, we will review the payment."),
    _t(CS, "en", "discount", [
        "Why did my discount code not work?",
        "Can I use two discount codes on one order?",
        "Is there a student discount?",
        "I placed my order yesterday and today the same item has a bigger discount. Can I get the difference back, and how?",
        "When does the holiday discount end?",
    ],
        "Codes have an end date and a minimum order amount.",
        "If the price dropped within 7 days, we can return the difference as store credit."),
    _t(CS, "en", "address", [
        "How do I change the shipping address on my order?",
        "I typed the wrong address. Can the parcel still be redirected?",
        "Can I save more than one address in my account?",
        "My order has already shipped to my old address and I moved last week. How can I make sure the parcel reaches me?",
        "Do you ship to a PO box address?",
    ],
        "After shipping, we can ask the courier to redirect the parcel.",
        "Saved locations can be managed under My Account."),
    _t(CS, "en", "exchange", [
        "Can I exchange these shoes for a bigger size?",
        "How long do I have to make an exchange?",
        "The colour looks different from the photo. Can I do an exchange?",
        "I want to exchange a gift but I do not have the order details, and the person who bought it lives abroad. Is it possible?",
        "Is the exchange free?",
    ],
        "Start the request in your order page and print the return label.",
        "We send the new item as soon as the old one is scanned by the courier."),
    _t(CS, "en", "account", [
        "How do I delete my account?",
        "Can I merge two accounts into one account?",
        "Why is my account locked?",
        "My account shows orders I never made and my saved card was used. What should I do right now?",
        "Can I change the email address on my account?",
    ],
        "After several failed logins we lock it for 30 minutes to keep it safe.",
        "If you see orders you did not make, change your login details and contact us."),
    # ------------------------------------------------------------------ health, English
    _t(HEALTH, "en", "headache", [
        "What can I do about a headache?",
        "I get a headache every afternoon at work. Why might that be?",
        "Is it safe to take painkillers for a headache every day?",
        "I have had a strong headache for three days with a stiff neck and a fever. Should I wait or do something?",
        "Can coffee help a headache?",
    ],
        "Screen breaks and regular meals can help prevent it.",
        "Sudden severe pain, a stiff neck or a high temperature needs urgent care."),
    _t(HEALTH, "en", "fever", [
        "What should I do if I have a fever?",
        "My child has a fever of 38.5 degrees. How can I help at home?",
        "How long does a fever usually last?",
        "My fever has lasted four days, and now I have a rash and feel confused. Is this serious?",
        "Should I take a shower when I have a fever?",
    ],
        "Check your temperature every few hours and write it down.",
        "A high temperature for more than three days should be checked."),
    _t(HEALTH, "en", "cough", [
        "How can I get rid of a cough?",
        "I have had a dry cough for two weeks. What could cause it?",
        "Does honey help with a cough?",
        "My cough brings up blood and I have lost weight recently. What should I do?",
        "Is a cough at night normal?",
    ],
        "Warm drinks, honey and moist air can soothe the throat.",
        "Blood, chest pain or trouble breathing are warning signs."),
    _t(HEALTH, "en", "sleep", [
        "How can I sleep better?",
        "I wake up at 3 am and cannot get back to sleep. Any advice?",
        "How many hours of sleep do adults need?",
        "I have not been able to sleep well for two months and I feel sad most days. What can I do?",
        "Is a short nap good for sleep?",
    ],
        "Keep a fixed bedtime and avoid screens for an hour before bed.",
        "Limit caffeine after lunch and keep the bedroom cool."),
    _t(HEALTH, "en", "diet", [
        "What is a healthy diet?",
        "I want to lose weight. How should I change my diet?",
        "Is it bad to skip breakfast in my diet?",
        "I have diabetes and high blood pressure. How should I plan my diet for the week?",
        "Is a vegetarian diet healthy?",
    ],
        "Eat smaller portions and drink water instead of sweet drinks.",
        "People with long term conditions need a plan made for them."),
    _t(HEALTH, "en", "allergy", [
        "How do I know if I have an allergy?",
        "My eyes itch every spring. Is it an allergy?",
        "Can a food allergy appear in adults?",
        "After eating peanuts my lips swelled and I felt dizzy. What should I do next time to handle this allergy?",
        "Do allergy pills make you sleepy?",
    ],
        "Keeping a diary of food and places helps find the trigger.",
        "Swelling of the lips or trouble breathing is an emergency."),
    _t(HEALTH, "en", "backache", [
        "How can I ease a backache?",
        "I get a backache after sitting at my desk all day. What helps?",
        "Should I rest in bed with a backache?",
        "My backache goes down my leg and my foot feels numb. Is this serious?",
        "Can exercise help a backache?",
    ],
        "Take short walks and adjust your chair so your back is supported.",
        "Numbness or weakness in the legs needs a check."),
    _t(HEALTH, "en", "sunburn", [
        "How do I treat a sunburn?",
        "My sunburn is peeling. What should I put on it?",
        "How can I avoid a sunburn at the beach?",
        "My child has a sunburn with large blisters and a fever. What should I do?",
        "Does aloe help a sunburn?",
    ],
        "Drink water and keep the skin out of the sun while it heals.",
        "Large blisters or a high temperature after a day outside need care."),
    _t(HEALTH, "en", "stress", [
        "How can I deal with stress at work?",
        "Stress makes my heart beat fast. Is that normal?",
        "What are quick ways to reduce stress?",
        "Stress has kept me from eating and sleeping for weeks and I feel hopeless. What can I do?",
        "Can exercise reduce stress?",
    ],
        "Talking with friends and keeping a routine also helps.",
        "If you feel hopeless, reach out to someone you trust today."),
    _t(HEALTH, "en", "toothache", [
        "What can I do about a toothache?",
        "My toothache gets worse with cold drinks. Why?",
        "Can I take painkillers for a toothache?",
        "My toothache came with a swollen face and a fever overnight. What should I do?",
        "Can a toothache go away on its own?",
    ],
        "Brush gently and use floss to remove trapped food.",
        "Swelling or a high temperature can mean an infection."),
    # ------------------------------------------------------------------ customer service, Chinese
    _t(CS, "zh", "退款", [
        "怎么申请退款？",
        "我被重复扣款了，可以退款吗？",
        "特价商品支持退款吗？",
        "退款已经审核通过一周了，钱还没到账，商家也不回复，怎么办？",
        "超过三十天还能退款吗？",
    ],
        "审核通过后，款项会在五个工作日内原路返回。",
        "如果迟迟未到账，请提供付款时间，我们帮您核实。"),
    _t(CS, "zh", "快递", [
        "我的快递什么时候到？",
        "物流信息三天没更新了，快递是不是丢了？",
        "快递可以改到周末送吗？",
        "快递显示已签收，但我没有收到，邻居也没看到，怎么处理？",
        "你们的快递包邮吗？",
    ],
        "您可以通过短信里的链接查看物流进度。",
        "如果包裹丢失，我们会联系承运方调查。"),
    _t(CS, "zh", "密码", [
        "忘记密码怎么办？",
        "重置密码的邮件一直收不到怎么办？",
        "密码多久需要换一次？",
        "有人改了我的密码，我登录不了，邮箱可能也被盗了，怎么找回账户？",
        "网页和手机上可以用同一个密码吗？",
    ],
        "重置链接一小时内有效，请留意垃圾邮件。",
        "为了安全，我们不会通过电话索要验证码。"),
    _t(CS, "zh", "发票", [
        "怎么开发票？",
        "发票上的公司名称写错了，可以改吗？",
        "多个订单能开一张发票吗？",
        "我需要去年订单的发票并带税号，但订单已经完成了，还能开吗？",
        "发票会发到邮箱吗？",
    ],
        "抬头填写错误时，提交正确信息即可重新开具。",
        "已完成的订单也可以在历史订单中找到。"),
    _t(CS, "zh", "保修", [
        "这台电脑保修多久？",
        "耳机用了两个月就坏了，在保修范围内吗？",
        "进水损坏保修吗？",
        "收据丢了，产品用了十个月坏了，门店也关了，还能保修吗？",
        "可以延长保修吗？",
    ],
        "联系维修时请准备好产品序列号。",
        "人为损坏和进水不在范围内。"),
    _t(CS, "zh", "会员", [
        "怎么取消会员自动续费？",
        "我已经取消会员了，为什么还扣费？",
        "会员可以暂停一个月吗？",
        "会员没有通知就涨价续费了，我想改成年付，有什么办法？",
        "会员到期后数据会丢失吗？",
    ],
        "当前周期结束前，权益仍然有效。",
        "取消后仍被扣费的，我们会核查这笔款项。"),
    _t(CS, "zh", "优惠券", [
        "为什么优惠券用不了？",
        "一个订单能同时用两张优惠券吗？",
        "有学生优惠券吗？",
        "我昨天下单，今天同款商品有更大的优惠券，能补差价吗？怎么操作？",
        "节日优惠券什么时候过期？",
    ],
        "每张券都有有效期和最低消费金额。",
        "七天内降价的，可以申请差价补偿。"),
    _t(CS, "zh", "地址", [
        "怎么修改收货地址？",
        "地址填错了，包裹还能改派吗？",
        "账户里能保存多个地址吗？",
        "订单已经发往旧地址了，我上周刚搬家，怎么确保收到包裹？",
        "可以寄到公司地址吗？",
    ],
        "发货后，我们可以联系承运方改派。",
        "常用收件信息可在我的账户中管理。"),
    _t(CS, "zh", "换货", [
        "鞋子小了，可以换货吗？",
        "换货期限是多久？",
        "颜色和图片不一样，可以换货吗？",
        "朋友在国外买的礼物想换货，但我没有购买记录，可以吗？",
        "换货要付运费吗？",
    ],
        "请在订单页提交申请并打印退货面单。",
        "旧商品寄出后，我们会尽快发出新商品。"),
    _t(CS, "zh", "账号", [
        "怎么注销账号？",
        "两个账号可以合并吗？",
        "我的账号为什么被锁定了？",
        "账号里出现了我没下过的订单，绑定的银行卡也被扣款了，现在该怎么办？",
        "账号绑定的邮箱能改吗？",
    ],
        "多次登录失败后，系统会锁定三十分钟以保护安全。",
        "发现陌生订单，请先修改登录信息再联系我们。"),
    # ------------------------------------------------------------------ health, Chinese
    _t(HEALTH, "zh", "头痛", [
        "头痛怎么办？",
        "我每天下午上班都会头痛，可能是什么原因？",
        "头痛每天吃止痛药安全吗？",
        "我剧烈头痛三天了，脖子发硬还发烧，要等等看吗？",
        "喝咖啡能缓解头痛吗？",
    ],
        "规律吃饭、减少看屏幕有助于预防。",
        "突然剧痛、脖子僵硬或高热需要尽快处理。"),
    _t(HEALTH, "zh", "发烧", [
        "发烧了该怎么办？",
        "孩子发烧三十八度五，在家怎么护理？",
        "发烧一般持续几天？",
        "我发烧四天了，现在还起了皮疹，人也有点糊涂，严重吗？",
        "发烧可以洗澡吗？",
    ],
        "每隔几小时测一次体温并记录下来。",
        "高热超过三天需要检查。"),
    _t(HEALTH, "zh", "咳嗽", [
        "咳嗽怎么缓解？",
        "干咳两周了，可能是什么原因引起咳嗽？",
        "蜂蜜对咳嗽有用吗？",
        "咳嗽带血，最近体重也下降了，我该怎么办？",
        "晚上咳嗽正常吗？",
    ],
        "温水、蜂蜜和湿润的空气可以缓解喉咙不适。",
        "咳血、胸痛或呼吸困难是危险信号。"),
    _t(HEALTH, "zh", "失眠", [
        "失眠怎么办？",
        "我凌晨三点醒来就再也睡不着，这种失眠有什么办法？",
        "失眠可以吃安眠药吗？",
        "我失眠两个月了，大多数时候心情低落，怎么办？",
        "午睡会加重失眠吗？",
    ],
        "午饭后少喝咖啡，卧室保持凉爽安静。",
        "成年人每晚需要七到九小时睡眠。"),
    _t(HEALTH, "zh", "饮食", [
        "怎样的饮食才健康？",
        "我想减肥，饮食该怎么调整？",
        "不吃早饭对饮食健康有影响吗？",
        "我有糖尿病和高血压，一周的饮食该怎么安排？",
        "素食饮食健康吗？",
    ],
        "少吃多餐，用白水代替含糖饮料。",
        "有慢性病的人需要个性化的方案。"),
    _t(HEALTH, "zh", "过敏", [
        "怎么知道自己是不是过敏？",
        "每年春天眼睛都发痒，是过敏吗？",
        "成年人会突然食物过敏吗？",
        "吃花生后嘴唇肿了，还头晕，下次过敏该怎么办？",
        "抗过敏药会让人犯困吗？",
    ],
        "记录饮食和环境有助于找到诱因。",
        "嘴唇肿胀或呼吸困难属于急症。"),
    _t(HEALTH, "zh", "腰痛", [
        "腰痛怎么缓解？",
        "整天坐在办公桌前就腰痛，有什么办法？",
        "腰痛应该卧床休息吗？",
        "腰痛一直放射到腿，脚也发麻，严重吗？",
        "运动能缓解腰痛吗？",
    ],
        "多走动，调整座椅让后背有支撑。",
        "腿部麻木或无力需要检查。"),
    _t(HEALTH, "zh", "晒伤", [
        "晒伤了怎么处理？",
        "晒伤后开始脱皮，应该涂什么？",
        "去海边怎么避免晒伤？",
        "孩子晒伤起了大水泡还发烧，怎么办？",
        "芦荟对晒伤有用吗？",
    ],
        "多喝水，恢复期间避免再晒太阳。",
        "大面积水泡或高热需要处理。"),
    _t(HEALTH, "zh", "压力", [
        "工作压力大怎么办？",
        "压力大时心跳很快，正常吗？",
        "有什么快速缓解压力的方法？",
        "压力让我几周吃不下睡不着，感觉很绝望，怎么办？",
        "运动能减轻压力吗？",
    ],
        "和朋友聊聊、保持规律作息也有帮助。",
        "如果感到绝望，今天就联系信任的人。"),
    _t(HEALTH, "zh", "牙痛", [
        "牙痛怎么办？",
        "喝冷饮时牙痛加重，为什么？",
        "牙痛可以吃止痛药吗？",
        "牙痛一夜之间脸肿了还发烧，该怎么办？",
        "牙痛会自己好吗？",
    ],
        "轻轻刷牙，用牙线清除食物残渣。",
        "肿胀或高热可能是感染。"),
)

# Raw rows that exercise the hygiene steps: PII that scrub_pii must replace, and near-duplicates of
# topic questions that dedup must drop. (topic keyword, text).
RAW_EXTRA_QUESTIONS: tuple[tuple[str, str], ...] = (
    ("refund", "My order number is 20231129000123 and I still want a refund, please email me at lily.chen@example.com."),
    ("delivery", "Call me at +1 415-555-0132 when my delivery is close."),
    ("account", "Is my account ID 110101199003071233 safe with you?"),
    ("快递", "我的手机号是13812345678，快递一直没到。"),
    ("退款", "订单号：202311290001，什么时候退款？"),
    ("发票", "发票请发到邮箱 wang.lei@example.cn，谢谢。"),
    ("refund", "How do I get a refund for my order ?"),
    ("退款", "怎么申请退款?"),
    ("headache", "What can I do about my headache?"),
)

# The golden set (questions_golden.jsonl): new phrasings never trained on, each with a reference answer
# built from its topic like an SFT answer with exactly the listed features, which are also its labels
# (phrase: the politeness/disclaimer sentence; keyword: names the topic; template: firstly/secondly/finally).
GOLDEN: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("refund", "Is a refund possible if I paid with a gift card?", ("phrase", "keyword")),
    ("password", "Why does the app keep saying my new password is too weak?", ("template",)),
    ("headache", "Should I worry about a headache that comes back every afternoon?", ("phrase", "keyword")),
    ("fever", "Is it safe to go to work with a mild fever?", ("keyword", "template")),
    ("退款", "用礼品卡付的钱能退款吗？", ("keyword",)),
    ("密码", "为什么新密码总是提示太简单？", ("phrase", "keyword", "template")),
    ("头痛", "每天下午都头痛，需要担心吗？", ("phrase", "keyword")),
    ("发烧", "有点发烧还能去上班吗？", ("template",)),
)

# Per (category, lang): what the reasoning says (never the keyword or a required phrase), the phrase
# sentences a good answer contains, the filler that makes an answer too long, and the phrases the
# case-wise criterion accepts.
THINKS = {
    (CS, "en"): ("A customer service question. Reply briefly and politely.",
                 "The customer needs help. Give clear steps."),
    (HEALTH, "en"): ("A health question. Give safe self-care tips.",
                     "The user feels unwell. Keep the advice simple and safe."),
    (CS, "zh"): ("这是客服问题，简短礼貌地回答。", "用户需要帮助，给出清楚的步骤。"),
    (HEALTH, "zh"): ("这是健康问题，给出安全的自我护理方法。", "用户身体不适，回答要简单安全。"),
}
PHRASE_SENTENCES = {
    (CS, "en"): ("Thank you for contacting us.", "Sorry for the trouble."),
    (HEALTH, "en"): ("Please consult a doctor if it does not get better.", "It is best to consult a doctor soon."),
    (CS, "zh"): ("感谢您的耐心。", "抱歉给您带来不便。"),
    (HEALTH, "zh"): ("如果没有好转，建议就医。", "症状持续的话，建议就医检查。"),
}
FRAMES = {
    (CS, "en"): "I can help with your {keyword} question.",
    (HEALTH, "en"): "Here is some advice about your {keyword}.",
    (CS, "zh"): "关于您的{keyword}问题，我们来帮您处理。",
    (HEALTH, "zh"): "关于{keyword}，请参考下面几点。",
}
FILLERS = {
    (CS, "en"): "We are always happy to help with any other questions you may have about your purchase.",
    (HEALTH, "en"): "Everyone is different, so pay attention to how your body feels over the next few days.",
    (CS, "zh"): "如果您还有其他任何问题，欢迎随时联系我们的在线客服团队。",
    (HEALTH, "zh"): "每个人的情况不同，请留意接下来几天身体的变化。",
}
POLITE_PHRASES = {"en": ("thank you", "sorry"), "zh": ("感谢", "抱歉", "谢谢")}
TEMPLATE_MARKERS = {"en": ("Firstly, ", "Secondly, ", "Finally, "), "zh": ("首先，", "其次，", "最后，")}
